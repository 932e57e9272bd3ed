"""Serving engines as judges: run an exported draft in the real engine and in our decoder, side by side.

`vllm_engine` drives vLLM (in its own venv, `make setup-engines`); `chain` runs our decoder with the chain
an engine drafts (top-1 per step, k tokens), so that the two acceptance lengths can be compared.
"""
