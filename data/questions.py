"""Benchmark prompts from ShareGPT that no committed artifact saw: a test split to report and a tune split to tune on.

    python scripts/make_questions.py --split     # writes data/questions/sharegpt-test.jsonl and sharegpt-tune.jsonl

Which conversations may be used (`exclusions`, `candidates`):
- a conversation is a candidate if it is on the held-out side of `split_heldout(sharegpt, 200, seed 0)` (the
  split every self-distilled file was drawn from: tier "heldout"), or on its train side *after* the last
  conversation any file in data/distilled/ answered (tier "tail": the distillation runs walk the train side in
  order and stopped there, so no committed artifact's data reached it);
- it is dropped if its id, or the original conversation it was cut from (ShareGPT V3 cuts long chats into
  ID_0, ID_1, ...; `base_id`), or the text of its prompt (`normalise`), or that text's first PREFIX_CHARS
  characters (near-duplicates: a reworded question, a shared prompt template), occurs in any training data: every
  record of every file in data/distilled/, every local data file a config or a committed artifact's
  train_config.json names, and the conversations a config that reads `sharegpt` itself trains on (its train
  side, cut to max_train_conversations); the old dev questions (data/questions/sharegpt-dev.jsonl, which the
  tree shapes and settings were tuned on) are dropped the same way;
- only the first segment of a conversation (ID_0: its first user turn starts the chat, later segments start
  mid-conversation), first user turns only, 15 to 2,000 characters, mostly Latin letters, in the first 200
  characters too (the classifier reads English), and one conversation per distinct prompt text.
Each candidate gets a category by `classify` (first matching rule of `CATEGORY_RULES`; no match: left out).
Per category the candidates are ordered by tier (held-out first) then by a hash of their id, and the first
TEST_PER_CATEGORY go to test, the next TUNE_PER_CATEGORY to tune. Files list the questions round-robin over
categories, so `--max-questions N` takes a balanced prefix.
"""

from __future__ import annotations

import glob
import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from specheads.data.sharegpt import Conversation, dataset_sources, load_conversations, split_heldout

HELDOUT_SIZE, SPLIT_SEED = 200, 0  # the split data/distilled/ was drawn from (self_distill.py --split train)
TEST_PER_CATEGORY, TUNE_PER_CATEGORY = 15, 8
MIN_CHARS, MAX_CHARS = 15, 2000
PREFIX_CHARS = 60  # a prompt that opens like a trained one (normalised) is a near-duplicate: left out
DEV_QUESTIONS = "data/questions/sharegpt-dev.jsonl"
# Configs whose training data is not excluded, and why.
IGNORED_CONFIGS = {
    "vicuna7b.yaml": "Medusa-1 for Vicuna-7B on GPUs: no artifact of it in the repository, and Vicuna heads are never "
                     "benchmarked on SmolLM2 or Qwen; it trains on all of ShareGPT but a held-out 500",
    "vicuna7b-medusa2.yaml": "Medusa-2 for Vicuna-7B on GPUs: the same data as vicuna7b.yaml, no artifact of it here",
    "vicuna7b-eagle3.yaml": "EAGLE-3 for Vicuna-7B on GPUs: the same data as vicuna7b.yaml, no artifact of it here",
}

# First match wins, in this order: a prompt with code in it is coding whatever else it asks; an explicit
# extraction or role-play instruction outranks the topic; "write ..." is writing unless something above matched;
# reasoning is advice, comparison and planning; STEM and humanities are what is left, by topic.
CATEGORY_RULES = [
    ("coding", r"```|`[^`\n]+`|\bdef \w+\(|\b(a|the|this|my|that) function\b|\bfunction\s*\(|\bclass \w|\bcode\b|\bcoding\b|\bpython|javascript|typescript|"
               r"\bsql\b|\bjava\b|c\+\+|\bc#|\bhtml\b|\bcss\b|\breact\b|node\.?js|\bapi\b|\bregex|\bjson\b|"
               r"\b(python|bash|shell|powershell|apps|js|php) script|\bprogramming\b|\bprogram (that|to|in|which)\b|\bbash\b|\bdocker|kubernetes|"
               r"\bgithub\b|\bgit\b|\bsnippet|\bcompil(e|er)\b|\bdebug|\bruby\b|\brust\b|golang|\bphp\b|\bflutter\b|"
               r"\bdjango\b|\bflask\b|\bnpm\b|\bpandas\b|\bnumpy\b|\bpyspark\b|\bdataframe|\bexcel formula|\bvba\b|"
               r"\bsolidity\b|\bshell\b|\becharts?\b|\bi/o\b|\bnginx\b|\bxcode\b|\bfrontend\b|\bbackend\b|\bdatabase\b|\bspring boot\b|\blaravel\b|\bvue\b|\bangular\b|"
               r"\bkotlin\b|\bswift\b|\bunity3?d?\b|\bc\+\+|\bconst \w+ =|\bvar \w+ =|\bimport \w+|\w\(\)|=>"),
    ("math", r"\d\s*[+*^×÷=]\s*\d|\d\s+-\s+\d|\bequation|\bcalculat|\bprobabilit|\bintegral|\bderivative|\bmath|"
             r"\bsolve (for|the|this|x)\b|\bprove (that|the)\b|\btheorem|\balgebra|\bgeometr|\bmatri(x|ces)\b|"
             r"\bvariance\b|\bstandard deviation|\brandom variable|\bfraction|\bhow many\b|\bformula\b|"
             r"\bpercentage\b|\bexpected value"),
    ("extraction", r"\bextract|\bsummar(y|ies|i[sz]e)|\btl;?dr\b|\bkey (points|takeaways)\b|\bclassify\b|"
                   r"\bcategori[sz]e\b|\bidentify (the|all|any)\b|\bconvert .{0,40}\b(into|to) (a )?(table|json|csv|list)|"
                   r"\bfrom (the|this) (following )?(text|passage|article|paragraph|document|transcript)|"
                   r"\bthe following (text|passage|paragraph|document|transcript)\b|\bin a table\b|\bmain (ideas?|points?)\b|"
                   r"\b(text|list|paragraph|passage|article|email|reviews?|transcript|data) below\b"),
    ("roleplay", r"\bact as\b|\bact like\b|\bpretend\b|\brole ?-?play|\byou are (a|an|my|the) |\bimagine (you are|you're)\b|"
                 r"\bplay the role\b|\bas if you (were|are)\b|\bi want you to be\b|\bfrom now on,? you\b|\byour role\b|"
                 r"\btext (adventure|game)\b|\bgame master\b|\binterview me\b"),
    ("writing", r"\bwrite\b|\bwriting\b|\bessay|\bstory\b|\bstories\b|\bpoem|\bpoetry|\bblog|\barticle|\bletter\b|"
                r"\bemail|\bre-?write|\bparaphrase|\bslogan|\bcaption|\btweet|\blinkedin post|\bpost (for|about)\b|"
                r"\blyrics|\bsong\b|\bheadline|\bcopy ?writ|\bdraft\b|\bcompose\b|\boutline\b|\bspeech\b|\bscript\b|"
                r"\bdescription for\b|\bproofread|\bgrammar\b|\btitles?\b|\bhaiku|\bnarrative\b|\bcover letter"),
    ("reasoning", r"\briddle|\bpuzzle|\blogic|\bdeduc|\bpros and cons\b|\bwhat would happen\b|\bshould i\b|\btrade-?offs?\b|"
                  r"\bcompare\b|\bcomparison\b|\bdifference between\b|\bwhich is better\b|\bwhy (is|are|do|does|did|would|"
                  r"should)\b|\bstrateg|\bplan\b|\bdecide|\bdecision|\b(dis)?advantages?\b|\bhow (can|do|should) (i|we)\b|"
                  r"\bbest way\b|\bsteps? (to|for)\b|\bideas?\b|\bsuggest|\brecommend|\bhow long would\b|\bif it takes\b"),
    ("stem", r"\bphysic|\bchemi|\bbiolog|\bengineer|\bmachine learning\b|\bdeep learning\b|\bartificial intelligence\b|"
             r"\b(ai|ml|nlp|gpt|llm|iot)\b|\bneural\b|\bscien|\bquantum|\benergy\b|\belectr|\bmedic|\bhealth|\bdisease|"
             r"\bclimate|\btechnolog|\bcomputer|\bsoftware|\bhardware|\balgorithm|\bdata\b|\bnetwork|\bcloud\b|"
             r"\bblockchain|\bcrypto|\bsecurity\b|\bcells?\b|\bgenes?\b|\bdna\b|\bmolecul|\batom|\bplanet|\bspace\b|"
             r"\bastronom|\bnutrition|\bprotein|\bvirus|\bbrain|\bframework\b|\bmodel\b|\bserver\b|\blinux\b|\bapp\b|"
             r"\bsensor|\brobot|\bsymptom|\btreatment\b|\bvaccine|\bspecies\b|\bearth\b|\bbattery|\bsolar\b|"
             r"\bcircuit|\bsignals?\b|\bgeolog|\bvolcan|\binfrastructure\b|\bencrypt|\bautonomous\b"),
    ("humanities", r"\bhistor|\bphilosoph|\bpolitic|\beconom|\blaws?\b|\blegal\b|\breligio|\bcultur|\bliteratur|\bart\b|"
                   r"\bmusic|\bpsycholog|\bsociolog|\bethic|\bbusiness|\bmarketing|\bfinanc|\beducation|\blinguist|\bbooks?\b|"
                   r"\bmovie|\bfilm|\bsociety|\bsocial|\bgovernment|\bwar\b|\bmoral|\bbible|\bgod\b|\bcompany|\bmarket\b|"
                   r"\bcustomers?\b|\bbrand|\bsales?\b|\bstartup|\binvest(ing|ment|ments|or|ors)?\b|\bwealth|\be-?commerce|\bsellers?\b|\bmoney\b|\bcareer|\bjobs?\b|\bteach|\bstudents?\b|"
                   r"\bschool|\buniversity|\btax|\bcountry|\bcity\b|\bpeople\b|\bpoet\b|\bnovel\b|\bauthor\b|\bcontract\b|"
                   r"\bmeaning of\b|\bwho (is|was|were)\b|\bbill of rights\b|\bconstitution|\bpresident|\belection|"
                   r"\bhousing\b"),
]
CATEGORIES = tuple(name for name, _ in CATEGORY_RULES)
_COMPILED = [(name, re.compile(pattern)) for name, pattern in CATEGORY_RULES]


def classify(text: str) -> str | None:
    """The category of a prompt: the first rule of CATEGORY_RULES that matches its lower-cased text; None if none."""
    lowered = text.lower()
    return next((name for name, pattern in _COMPILED if pattern.search(lowered)), None)


def base_id(conversation_id: str) -> str:
    """The original ShareGPT conversation an id was cut from: 'abc_2' -> 'abc'."""
    return re.sub(r"_\d+$", "", conversation_id)


def normalise(text: str) -> str:
    """A prompt's text for duplicate checks: lower case, whitespace collapsed."""
    return " ".join(text.lower().split())


def user_turns(conversation: Conversation) -> list[str]:
    return [m["content"] for m in conversation.messages if m["role"] == "user"]


def mostly_latin(text: str, share: float = 0.9) -> bool:
    letters = [ch for ch in text if ch.isalpha()]
    return bool(letters) and sum(ch.isascii() for ch in letters) >= share * len(letters)


@dataclass
class Exclusions:
    """What no benchmark prompt may share with training data: ids, original conversations, prompt texts."""
    ids: set = field(default_factory=set)
    base_ids: set = field(default_factory=set)
    texts: set = field(default_factory=set)
    prefixes: set = field(default_factory=set)  # the first PREFIX_CHARS of each normalised text
    sources: dict = field(default_factory=dict)  # source -> conversations it contributed
    ignored: dict = field(default_factory=dict)  # config -> why its data is not excluded

    def add(self, source: str, conversations) -> None:
        if source in self.sources:  # a file several configs name
            return
        count = 0
        for conversation in conversations:
            self.ids.add(conversation.id)
            self.base_ids.add(base_id(conversation.id))
            texts = [normalise(t) for t in user_turns(conversation)]
            self.texts.update(texts)
            self.prefixes.update(t[:PREFIX_CHARS] for t in texts)
            count += 1
        self.sources[source] = count

    def hits(self, conversation_id: str, text: str) -> bool:
        return (conversation_id in self.ids or base_id(conversation_id) in self.base_ids
                or normalise(text) in self.texts or normalise(text)[:PREFIX_CHARS] in self.prefixes)


def _data_sections(node, inherited=None):
    """Every `data:` mapping of a config (stages included), each completed from the top-level one."""
    if isinstance(node, dict):
        data = node.get("data")
        if isinstance(data, dict):
            merged = {**(inherited or {}), **data}
            yield merged
            inherited = inherited or merged
        for key, value in node.items():
            if key != "data":
                yield from _data_sections(value, inherited)
    elif isinstance(node, list):
        for item in node:
            yield from _data_sections(item, inherited)


def training_data(repo: Path) -> list[tuple[str, dict]]:
    """(where, data section) of every config in configs/ and every committed artifact's train_config.json."""
    found = []
    for path in sorted(repo.glob("configs/*.yaml")):
        for section in _data_sections(yaml.safe_load(path.read_text())):
            found.append((f"configs/{path.name}", section))
    for path in sorted([*repo.glob("heads/trained/*/train_config.json"), *repo.glob("runs/*/train_config.json")]):
        section = json.loads(path.read_text()).get("data")
        if isinstance(section, dict):
            found.append((str(path.relative_to(repo)), section))
    return found


def _exclude_source(repo: Path, sharegpt, excluded: Exclusions, where: str, section: dict, dataset: str) -> None:
    if dataset == "sharegpt":
        train, _ = split_heldout(sharegpt, int(section.get("heldout_size", 200)), int(section.get("split_seed", 0)))
        excluded.add(f"{where} (sharegpt train side)", train[: section.get("max_train_conversations")])
    elif (repo / dataset).is_file():
        excluded.add(dataset, load_conversations(str(repo / dataset)))
    else:
        raise ValueError(f"{where}: data.dataset {dataset!r} is neither `sharegpt` nor a file in the repository: "
                         "cannot check the benchmark prompts against it")


def exclusions(repo: Path, sharegpt: list[Conversation]) -> Exclusions:
    """Everything any training data holds (see the module docstring); a data source that cannot be read raises."""
    excluded = Exclusions()
    for path in sorted(glob.glob(str(repo / "data" / "distilled" / "*.jsonl"))):
        excluded.add(str(Path(path).relative_to(repo)), load_conversations(path))
    for where, section in training_data(repo):
        name = Path(where).name
        if name in IGNORED_CONFIGS:
            excluded.ignored[where] = IGNORED_CONFIGS[name]
            continue
        for dataset, _ in dataset_sources(section.get("dataset", "sharegpt")):
            _exclude_source(repo, sharegpt, excluded, where, section, dataset)
    dev = repo / DEV_QUESTIONS
    if dev.is_file():
        dev_questions = [json.loads(line) for line in dev.read_text(encoding="utf-8").split("\n") if line.strip()]
        excluded.add(DEV_QUESTIONS, [Conversation(str(q["question_id"]), [{"role": "user", "content": t}
                                                                         for t in q["turns"]])
                                     for q in dev_questions])
    return excluded


def candidate_pool(sharegpt: list[Conversation], distilled_ids: set) -> list[tuple[str, Conversation]]:
    """(tier, conversation): the held-out side of the distillation split, then its train side after the last
    conversation any distilled file answered."""
    train, heldout = split_heldout(sharegpt, HELDOUT_SIZE, SPLIT_SEED)
    last = max((i for i, c in enumerate(train) if c.id in distilled_ids), default=-1)
    return [("heldout", c) for c in heldout] + [("tail", c) for c in train[last + 1:]]


def candidates(sharegpt: list[Conversation], excluded: Exclusions, distilled_ids: set) -> list[dict]:
    """Every usable prompt of the pool, with its tier and category (None when no rule matches)."""
    found, seen = [], set()
    for tier, conversation in candidate_pool(sharegpt, distilled_ids):
        if not conversation.id.endswith("_0"):
            continue
        turns = user_turns(conversation)
        if not turns:
            continue
        text = turns[0]
        key = normalise(text)
        if (not (MIN_CHARS <= len(text.strip()) <= MAX_CHARS) or not mostly_latin(text)
                or not mostly_latin(text[:200]) or key in seen):
            continue
        if excluded.hits(conversation.id, text):
            continue
        seen.add(key)
        found.append({"question_id": conversation.id, "category": classify(text), "turns": [text], "tier": tier})
    return found


def _order(candidate: dict) -> tuple:
    return (candidate["tier"] != "heldout", hashlib.sha256(candidate["question_id"].encode()).hexdigest())


def round_robin(by_category: dict[str, list[dict]]) -> list[dict]:
    out, depth = [], max((len(v) for v in by_category.values()), default=0)
    for i in range(depth):
        out += [qs[i] for c, qs in by_category.items() if i < len(qs)]
    return out


def make_splits(repo: Path, dataset: str = "sharegpt", test_per_category: int = TEST_PER_CATEGORY,
                tune_per_category: int = TUNE_PER_CATEGORY) -> dict:
    """-> {"test": [...], "tune": [...], "available": {category: {tier: n}}, "exclusions": Exclusions}."""
    repo = Path(repo)
    sharegpt = load_conversations(dataset)
    excluded = exclusions(repo, sharegpt)
    distilled_ids = set()
    for path in glob.glob(str(repo / "data" / "distilled" / "*.jsonl")):
        distilled_ids |= {c.id for c in load_conversations(path)}
    pool = candidates(sharegpt, excluded, distilled_ids)
    available = {c: {} for c in CATEGORIES}
    test, tune = {}, {}
    for category in CATEGORIES:
        ranked = sorted((q for q in pool if q["category"] == category), key=_order)
        for q in ranked:
            available[category][q["tier"]] = available[category].get(q["tier"], 0) + 1
        test[category] = ranked[:test_per_category]
        tune[category] = ranked[test_per_category:test_per_category + tune_per_category]
    strip = lambda qs: [{k: q[k] for k in ("question_id", "category", "turns")} for q in qs]  # noqa: E731
    return {"test": strip(round_robin(test)), "tune": strip(round_robin(tune)), "available": available,
            "unclassified": sum(q["category"] is None for q in pool), "exclusions": excluded,
            "tiers": {q["question_id"]: q["tier"] for q in pool}}


def write_jsonl(path: Path, questions: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(q, ensure_ascii=False) + "\n" for q in questions))
