"""Tree-speculative greedy decoding of several prompts at once, each row at its own pace.

Rows accept different numbers of tokens per step, yet a transformers cache has one length for the whole
batch. So the cache is a grid of slots with a per-row `valid` mask: a step appends one block of slots (the
widest row's tree), each row moves its accepted nodes to the front of the block (as the single-row decoder
does), and the block is cut to the longest accepted path; the slots a row did not fill stay masked for it.
Every row keeps its own true length, which gives its position ids. Attention goes through a 4D additive
mask [B, 1, new, cache] and explicit position ids — the public API, so any causal LM works. Rows whose
trees are smaller are padded with nodes that see only themselves and are never accepted. Finished rows
leave the batch (`Cache.batch_select_indices`).

Greedy only: every row's tokens equal the base's own greedy decoding of that prompt.
Sources: plain (none), Medusa heads, prompt lookup — any source without per-generation state — and
sources that keep some, which each row gets a copy of (`spawn`): feature-level drafts (EAGLE) keep a draft
cache per generation (a copy shares the draft weights and has its own cache; each row commits its own
accepted tokens and base states), and combinations such as heads with prompt lookup
(candidates.lookup_with_heads) copy the sources inside them that need it. The base forward is batched;
the drafts run row by row.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from .candidates import MedusaCandidates, NoCandidates
from .kv_cache import cache_argument_name, keep_accepted_paths, prepare_cache_for_rollback
from .source import follows_features
from .tree import additive_mask
from .verify import accept, follow, position_budget


def left_pad(prompts: list[list[int]], pad_id: int, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts of different lengths -> ids [B, P] padded on the left, and which slots are real [B, P] (bool)."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    valid = torch.zeros((len(prompts), width), dtype=torch.bool, device=device)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.tensor(prompt, device=device)
        valid[row, width - len(prompt):] = True
    return ids, valid


class BatchedTreeDecoder:
    """BatchedTreeDecoder(model[, heads, tree | candidates=src]).generate(prompts, max_new_tokens, eos)."""

    def __init__(self, model, heads=None, tree=None, candidates=None):
        if candidates is None and heads is not None:
            candidates = MedusaCandidates.for_model(model, heads, tree)
        stateful = candidates is not None and candidates.stateful
        if stateful and candidates.reads_verify_logits:
            raise ValueError(f"{type(candidates).__name__} cannot give each row a copy of its own (spawn): batched "
                             "decoding takes plain, Medusa, prompt-lookup or EAGLE candidates and their combinations")
        if stateful:
            candidates.spawn()  # a source (or a combination's part) that cannot be copied fails here, not mid-batch
        self.model = model
        self.candidates = candidates or NoCandidates(model.device)
        self.per_row = stateful  # one spawned copy of the source per row (EAGLE drafts, combined sources)
        self.commits = follows_features(self.candidates)  # a feature-level draft follows each row's accepted tokens
        self.feature_layers = tuple(self.candidates.feature_layers)
        self._features = []
        self._cache_argument = cache_argument_name(model)
        self.base_forwards = 0
        self.forwards_by_row = []  # per prompt of the last generate: the base forwards it took part in

    @property
    def row_forwards(self) -> int:
        """Σ over forwards of the rows in them: τ = new tokens / row_forwards."""
        return sum(self.forwards_by_row)

    def _forward(self, rows, input_ids, position_ids, mask, cache):
        """One base forward of `rows` (their indices among the prompts, one input row each)."""
        out = self.model(input_ids=input_ids, position_ids=position_ids, attention_mask=mask, use_cache=True,
                         output_hidden_states=True, **{self._cache_argument: cache})
        self.base_forwards += 1
        for row in rows:
            self.forwards_by_row[row] += 1
        # Feature-level drafts read these layers' states at each row's accepted positions.
        self._features = [out.hidden_states[layer] for layer in self.feature_layers]
        return out.logits, out.hidden_states[-1]

    def _prefill(self, prompts: list[list[int]], pad_id: int, cache):
        """Left-padded prompts through the base; -> last logits [B, V], last hidden [B, H], valid [B, P]."""
        device, dtype = self.model.device, self.model.dtype
        ids, valid = left_pad(prompts, pad_id, device)
        width = ids.shape[1]
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)
        causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
        allowed = causal[None] & valid[:, None, :]
        allowed |= torch.eye(width, dtype=torch.bool, device=device)[None]  # padding queries see themselves only
        logits, hidden = self._forward(range(len(prompts)), ids, positions, additive_mask(allowed, dtype)[:, None],
                                       cache)
        return logits[:, -1], hidden[:, -1], valid

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], max_new_tokens: int, eos_token_ids=(), pad_token_id: int = 0):
        """New token ids per prompt (greedy), each stopped at its first EOS or at max_new_tokens."""
        device, dtype = self.model.device, self.model.dtype
        eos = set(int(t) for t in eos_token_ids)
        self.base_forwards = 0
        self.forwards_by_row = [0] * len(prompts)
        if max_new_tokens < 1 or not prompts:
            return [[] for _ in prompts]
        budgets = [position_budget(self.model, len(p), max_new_tokens) for p in prompts]  # as TreeDecoder's
        cache = DynamicCache(config=self.model.config)
        prepare_cache_for_rollback(cache)
        logits, hidden, valid = self._prefill(prompts, pad_token_id, cache)
        lengths = torch.tensor([len(p) for p in prompts], device=device)
        contexts = [list(p) for p in prompts]
        outputs = [[] for _ in prompts]
        rows = list(range(len(prompts)))  # the original index of each row still decoding
        pending = [[int(t)] for t in logits.argmax(-1)]
        sources = [self.candidates.spawn() for _ in prompts] if self.per_row else [self.candidates] * len(prompts)
        if self.commits:  # each draft reads its row's prompt: states at the row's real (right-aligned) positions
            width = valid.shape[1]
            for i, prompt in enumerate(prompts):
                sources[i].commit(prompt[1:] + pending[i], [f[i, width - len(prompt):] for f in self._features])
        while True:
            # Emit each row's accepted tokens; rows that hit EOS or the budget leave the batch.
            alive = []
            for i, row in enumerate(rows):
                for token in pending[i]:
                    if len(outputs[row]) >= budgets[row]:
                        break
                    outputs[row].append(token)
                    if token in eos:
                        break
                if len(outputs[row]) < budgets[row] and outputs[row][-1] not in eos:
                    alive.append(i)
            if not alive:
                return outputs
            if len(alive) < len(rows):
                keep = torch.tensor(alive, device=device)
                cache.batch_select_indices(keep)
                valid, lengths, hidden = valid[keep], lengths[keep], hidden[keep]
                rows, pending = [rows[i] for i in alive], [pending[i] for i in alive]
                sources = [sources[i] for i in alive]
            for i, row in enumerate(rows):
                contexts[row].extend(pending[i][:-1])

            # Each row's tree, padded to the widest one.
            proposals = [sources[i].propose(pending[i][-1], hidden[i], contexts[row]) for i, row in enumerate(rows)]
            width = max(len(tokens) for tokens, _ in proposals)
            tokens = torch.zeros((len(rows), width), dtype=torch.long, device=device)
            positions = lengths[:, None].repeat(1, width)
            tree = torch.eye(width, dtype=torch.bool, device=device).repeat(len(rows), 1, 1)
            for i, (row_tokens, buffers) in enumerate(proposals):
                n = len(row_tokens)
                tokens[i, :n] = row_tokens
                positions[i, :n] += buffers.depths
                tree[i, :n, :n] = buffers.attention_mask.bool()
            allowed = torch.cat([valid[:, None, :].expand(-1, width, -1), tree], dim=2)
            logits, states = self._forward(rows, tokens, positions, additive_mask(allowed, dtype)[:, None], cache)

            # Accept per row, move the accepted nodes to the front of the block, cut the block.
            accepted = []
            for i, (row_tokens, buffers) in enumerate(proposals):
                path, bonus = accept("greedy", sources[i], row_tokens, logits[i, :len(row_tokens)], buffers)
                accepted.append(path)
                contexts[rows[i]].append(pending[i][-1])
                pending[i] = follow(sources[i], row_tokens, path, bonus, [f[i] for f in self._features])
            kept = keep_accepted_paths(cache, width, accepted)
            block = torch.zeros((len(rows), kept), dtype=torch.bool, device=device)
            for i, path in enumerate(accepted):
                block[i, :len(path)] = True
            valid = torch.cat([valid, block], dim=1)
            lengths = lengths + torch.tensor([len(path) for path in accepted], device=device)
            hidden = torch.stack([states[i, path[-1]] for i, path in enumerate(accepted)])
