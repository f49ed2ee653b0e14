"""The embedded default's drafts: DSpark (Markov and RNN heads), DFlash and Eagle3-style, trained here.

Recipe (DeepSpec's, at toy scale): the target answers a mix of training prompts (math, code, chat;
never the evaluation sets) itself, half greedily and half sampled at T = 1, so the drafts learn the
distribution they will be verified against at both temperatures; one target forward per sequence
records the hidden states the drafts read and the logits the L1/BCE terms need; every draft trains on
the same cache with the same step budget. STS temperatures are then fitted for the DSpark drafts on
held-out prompts (the corpus' validation split), sampled at T = 1 where acceptance is uncertain.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator

import torch

from dspark_core.calibration import fit_sts_level
from dspark_core.checkpoint import save_draft
from dspark_core.draft_vocabulary import choose_draft_vocabulary, coverage, token_counts
from dspark_core.drafters import as_drafter, build_draft_model, draft_config_for
from dspark_core.drafters.config import DraftConfig
from dspark_core.drafters.dspark import DSparkModel
from dspark_core.drafters.eagle3 import Eagle3Model
from dspark_core.generate import GenerationConfig, generate
from dspark_core.target import TargetModel
from dspark_core.target_cache import TargetCache, build_target_cache, generate_answers, record_cache
from dspark_core.training import DraftLoss, TrainConfig, TrainResult, evaluate_draft, train_draft
from recipes.embedded.corpus import DOMAINS, Corpus
from recipes.embedded.evaluate import confidence_table
from recipes.embedded.instructions import instruction_prompts
from inputs.tasks.prompts import stop_tokens


@dataclass(frozen=True)
class DraftSpec:
    """One draft of the embedded default: its directory name and how it is built."""

    name: str
    method: str  # dspark | dflash | eagle3
    head: str = "markov"
    num_layers: int = 2


DRAFTS: tuple[DraftSpec, ...] = (
    DraftSpec("dspark", "dspark", "markov"),
    DraftSpec("dspark-rnn", "dspark", "rnn"),
    DraftSpec("dflash", "dflash", "none"),
    DraftSpec("eagle3", "eagle3", "none", num_layers=1),
)


@dataclass(frozen=True)
class DraftPreset:
    prompts_per_domain: int = 160  # cache prompts; half answered greedily, half at T = 1
    # Open-ended chat instructions added to the chat domain's cache prompts (recipes/embedded/instructions.py):
    # prompts without answers, so only for a target that answers itself in its own chat voice (a real one).
    instruction_prompts: int = 0
    max_new_tokens: int = 160
    markov_rank: int = 64  # r scaled to the model: the paper's 256 is for V = 152k, hidden 2.5k–5k
    # Markov W1's rows (`DraftConfig.markov_w1_rows`): "draft" indexes it by the draft vocabulary (and one shared
    # row) where the draft has one, so the rank costs draft_vocab_size · r, not vocab · r, on disk.
    markov_w1_rows: str = "target"
    block_size: int = 7
    train: TrainConfig = TrainConfig(steps=500, lr=3e-3, batch_size=8, anchors_per_sequence=24)
    sts_prompts_per_domain: int = 32
    sts_gamma: int = 7
    # Real targets (recipes/real): fewer feature layers, a narrower MLP and bf16 target forwards keep a 135M
    # target's drafts small on disk and its build within 2 cores' time. Drafts always train in fp32: under bf16
    # autocast (measured on an AVX512-BF16/AMX CPU, DSpark on SmolLM2-135M) a step was only 1.15× faster
    # (0.21 s against 0.24 s) and the draft did not learn: after 40 steps held-out CE 36.7 against 7.46, the
    # gradient norm still at its initial 45–50. The frozen LM head's products alone may run in bf16
    # (`TrainConfig.lm_head_dtype`; recipes/real/build.py sets the target's dtype): that trains as fp32 does.
    num_target_features: int = 5
    intermediate_size: int | None = None  # None: the target's
    mask_token: str = "<|mask|>"
    target_dtype: str = "float32"
    cache_batch_size: int = 48
    # A reduced draft vocabulary (dspark_core/draft_vocabulary.py): the tokens the target's cached answers use
    # most. None: the target's whole vocabulary (the embedded default's 512 words need no reduction).
    draft_vocab_size: int | None = None


DRAFT_PRESETS = {
    "default": DraftPreset(),
    "reduced": DraftPreset(
        prompts_per_domain=16, max_new_tokens=48, markov_rank=32,
        train=TrainConfig(steps=40, lr=3e-3, batch_size=4, anchors_per_sequence=8), sts_prompts_per_domain=8,
    ),
}


@dataclass
class DraftReport:
    name: str
    method: str
    head: str
    num_params_trainable: int
    train_seconds: float
    loss_first: float
    loss_last: float
    heldout_loss: float
    heldout_acceptance: float  # mean analytic acceptance α at T = 1 on held-out sequences
    sts_temperatures: dict[str, list[float]] | None = None  # decoding temperature ("0", "1") → one per position
    sts_offsets: dict[str, list[float]] | None = None  # the level offsets fitted with them (fit_sts_level), same keys
    draft_vocab_size: int | None = None  # None: the target's whole vocabulary
    draft_vocab_coverage: float | None = None  # share of held-out answer tokens inside the draft vocabulary
    # mean σ(c) of the confidence head on the held-out sequences, weighted as held-out α is: above α, the head
    # promises more than the draft delivers on answers it has not fit (None: no head, or a record from before)
    heldout_confidence: float | None = None


def chat_prompt(tokenizer, user: str) -> list[int]:
    from inputs.tasks import tokenize_messages

    return tokenize_messages(tokenizer, [{"role": "user", "content": user}])


def cache_prompts(corpus: Corpus, tokenizer, per_domain: int, instructions: int = 0) -> list[list[int]]:
    """First user turns of the first `per_domain` training examples of each domain (corpus order is fixed), the
    chat domain's followed by `instructions` open-ended ones (recipes/embedded/instructions.py)."""
    prompts: list[list[int]] = []
    for domain in DOMAINS:
        examples = [e for e in corpus.train if e.domain == domain][:per_domain]
        if len(examples) < per_domain:
            raise ValueError(f"the corpus has {len(examples)} {domain} training examples, the preset asks for "
                             f"{per_domain} per domain: raise its CorpusCaps or lower prompts_per_domain")
        prompts += [chat_prompt(tokenizer, e.turns[0][0]) for e in examples]
        if domain == "chat":
            prompts += [chat_prompt(tokenizer, text) for text in instruction_prompts(instructions)]
    return prompts


def heldout_prompts(corpus: Corpus, tokenizer, per_domain: int) -> list[list[int]]:
    return [chat_prompt(tokenizer, e.turns[0][0]) for d in DOMAINS for e in corpus.val[d][:per_domain]]


def build_cache(target: TargetModel, tokenizer, corpus: Corpus, preset: DraftPreset, layer_ids, seed: int) -> TargetCache:
    """The training cache: half the prompts answered greedily, half at T = 1. With a reduced draft vocabulary
    the answers are generated first, the vocabulary chosen from them, and only its columns kept (as
    log-probabilities: dspark_core/target_cache.py), so a real target's cache holds ≈ 6× more answers in the
    same memory."""
    prompts = cache_prompts(corpus, tokenizer, preset.prompts_per_domain, preset.instruction_prompts)
    halves = ((prompts[0::2], 0.0, seed), (prompts[1::2], 1.0, seed + 100_000))
    answers = [generate_answers(target, half, max_new_tokens=preset.max_new_tokens, temperature=temperature,
                                stop_token_ids=stop_tokens(tokenizer), seed=half_seed, batch_size=preset.cache_batch_size)
               for half, temperature, half_seed in halves]
    logit_ids = None
    if preset.draft_vocab_size is not None:
        logit_ids = choose_vocabulary((a for half in answers for a in half), corpus, tokenizer, preset.draft_vocab_size,
                                      target.vocab_size)
    parts = [record_cache(target, half, a, layer_ids=layer_ids, batch_size=preset.cache_batch_size,
                          logits_dtype=torch.bfloat16, logit_ids=logit_ids,
                          meta={"temperature": temperature, "max_new_tokens": preset.max_new_tokens, "seed": half_seed})
             for (half, temperature, half_seed), a in zip(halves, answers)]
    return TargetCache(parts[0].sequences + parts[1].sequences, parts[0].layer_ids, {"halves": [c.meta for c in parts]},
                       logit_ids, parts[0].target_vocab_size)


STS_DECODING_TEMPERATURES = (0.0, 1.0)


def fit_calibration(target: TargetModel, model, tokenizer, corpus: Corpus, preset: DraftPreset, seed: int
                    ) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """STS temperatures and level offsets (`calibration.fit_sts_level`) on held-out prompts, one fit per decoding
    temperature: ({T: temperatures}, {T: offsets}).

    The confidence head learns α at T = 1; greedy verification accepts more (exact match with the
    argmax), so a single calibration cannot serve both. The offsets are what a temperature cannot do: the head
    learned the acceptance of the draft's training answers, where the draft is better than on new text, so on
    held-out text every position promises too much (a level shift). Keyed by f"{T:g}"; a temperature at which
    no verify step happened (every answer ended at its first token) has no entry.
    """
    prompts = heldout_prompts(corpus, tokenizer, preset.sts_prompts_per_domain)
    fitted, offsets = {}, {}
    for temperature in STS_DECODING_TEMPERATURES:
        config = GenerationConfig(max_new_tokens=preset.max_new_tokens, num_drafts=preset.sts_gamma,
                                  temperature=temperature, stop_token_ids=stop_tokens(tokenizer))
        results = generate(target, as_drafter(model), prompts, config, seed=seed)
        table = confidence_table(results, preset.sts_gamma)
        if table is None:  # every answer ended at its first token: nothing to calibrate on
            continue
        temps, levels = fit_sts_level(*table)
        fitted[f"{temperature:g}"] = [float(t) for t in temps]
        offsets[f"{temperature:g}"] = [float(b) for b in levels]
    return fitted, offsets


@dataclass
class DraftInputs:
    """What every draft of one build trains from: the target, its caches (training and held-out) and the
    shape of each draft. One object, so a build and an ablation (recipes/real/ablate.py) train from the very
    same caches."""

    target: TargetModel
    tokenizer: object
    corpus: Corpus
    preset: DraftPreset
    configs: dict  # draft name → DraftConfig (full vocabulary; `train_one` applies a reduced one)
    cache: TargetCache
    heldout: TargetCache
    seed: int
    drafts: tuple[DraftSpec, ...]
    work_dir: Path | None  # where the caches are kept; a build with one also keeps the drafts it already wrote
    cache_key: str = ""  # `_cache_key` of the caches: a kept draft must have trained on these very caches
    vocabularies: dict = field(default_factory=dict)  # draft vocabulary size → (token ids, held-out coverage)

    def check_vocabulary(self, size: int | None) -> None:
        """Raises, before any training, when this cache cannot train a draft over `size` tokens (None: the whole
        vocabulary): a compact cache keeps log-probabilities at its preset's draft vocabulary only
        (dspark_core/target_cache.py), so it trains that vocabulary or a smaller one (a subset: see
        `choose_vocabulary`), never a larger one."""
        kept = self.cache.logit_ids
        if kept is None:
            return
        if size is None:
            raise ValueError(f"a draft over the whole vocabulary: this target cache keeps log-probabilities at "
                             f"{kept.numel()} tokens only (its preset's draft_vocab_size); build the cache from a "
                             f"preset without draft_vocab_size, or ask for {kept.numel()} tokens or fewer")
        if size > kept.numel():
            raise ValueError(f"a {size}-token draft vocabulary: this target cache keeps {kept.numel()} tokens only "
                             f"(its preset's draft_vocab_size); build the cache with a larger one")

    def config_for(self, name: str, draft_vocab_size: int | None) -> DraftConfig:
        """The config draft `name` trains with over `draft_vocab_size` tokens (None: the whole vocabulary), its
        Markov W1 over that vocabulary where the preset asks and the draft has the head and the vocabulary."""
        return config_over_vocabulary(self.configs[name], self.preset, draft_vocab_size)

    def vocabulary(self, size: int) -> tuple[torch.Tensor, float]:
        """The `size`-token draft vocabulary chosen from the training answers, and its coverage of the held-out
        answers (which the choice never saw)."""
        self.check_vocabulary(size)
        if size not in self.vocabularies:
            vocab = choose_vocabulary(answer_tokens(self.cache), self.corpus, self.tokenizer, size, self.cache.vocab_size)
            self.vocabularies[size] = vocab, coverage(vocab, answer_tokens(self.heldout))
        return self.vocabularies[size]


def draft_inputs(
    target_dir: str | Path,
    corpus: Corpus,
    *,
    preset: str | DraftPreset = "default",
    seed: int = 0,
    drafts: tuple[DraftSpec, ...] = DRAFTS,
    log: Callable[[str], None] = print,
    work_dir: str | Path | None = None,
) -> DraftInputs:
    """The target and its caches for `drafts`; with `work_dir` the caches are kept there (keyed by everything
    that makes them) and read back by a later build or ablation with the same settings."""
    from transformers import AutoTokenizer

    p = DRAFT_PRESETS[preset] if isinstance(preset, str) else preset
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    target = TargetModel.from_pretrained(target_dir, dtype=getattr(torch, p.target_dtype))
    mask_id = tokenizer.convert_tokens_to_ids(p.mask_token)
    if not isinstance(mask_id, int):
        raise ValueError(f"mask token {p.mask_token!r} is not one token of {target_dir}'s tokenizer")
    configs = {
        d.name: draft_config_for(
            target, d.method, mask_token_id=mask_id, head=d.head, num_layers=d.num_layers,
            markov_rank=p.markov_rank, block_size=p.block_size, num_target_features=p.num_target_features,
        )
        for d in drafts
    }
    if p.intermediate_size is not None:
        configs = {name: replace(c, intermediate_size=p.intermediate_size) for name, c in configs.items()}
    layer_ids = next(iter(configs.values())).target_layer_ids
    target.set_layer_ids(layer_ids)  # the STS fits generate with the drafts, which read exactly these layers
    start = time.perf_counter()
    key = _cache_key(corpus, p, seed, target_dir, layer_ids)
    cache = _kept(work_dir, "train", key, log, lambda: build_cache(target, tokenizer, corpus, p, layer_ids, seed))
    heldout = _kept(work_dir, "heldout", key, log, lambda: build_target_cache(
        target, heldout_prompts(corpus, tokenizer, p.sts_prompts_per_domain), layer_ids=layer_ids,
        max_new_tokens=p.max_new_tokens, temperature=1.0, stop_token_ids=stop_tokens(tokenizer),
        seed=seed + 200_000, logits_dtype=torch.bfloat16, batch_size=p.cache_batch_size, logit_ids=cache.logit_ids,
    ))
    log(f"target cache: {len(cache)} sequences, {sum(s.num_tokens for s in cache.sequences)} tokens "
        f"in {time.perf_counter() - start:.0f} s")
    return DraftInputs(target, tokenizer, corpus, p, configs, cache, heldout, seed, drafts,
                       None if work_dir is None else Path(work_dir), cache_key=key)


def config_over_vocabulary(config: DraftConfig, preset: DraftPreset, draft_vocab_size: int | None) -> DraftConfig:
    """`config` over `draft_vocab_size` tokens, its Markov W1 indexed by them where `preset` asks and the draft
    has the head: one rule for what is trained and for what the repository budget expects on disk."""
    by_draft = preset.markov_w1_rows == "draft" and draft_vocab_size is not None and config.head != "none"
    return replace(config, draft_vocab_size=draft_vocab_size, markov_w1_rows="draft" if by_draft else "target")


@dataclass
class TrainedDraft:
    model: DSparkModel | Eagle3Model  # in the target's dtype
    result: TrainResult
    heldout: DraftLoss
    vocab_coverage: float | None

    @property
    def heldout_confidence(self) -> float | None:
        """The confidence head's held-out mean σ(c) for a record (None: the draft has no head)."""
        return None if math.isnan(self.heldout.confidence) else self.heldout.confidence


def train_one(inputs: DraftInputs, spec: DraftSpec, train_cfg: TrainConfig, draft_vocab_size: int | None) -> TrainedDraft:
    """One draft trained on `inputs.cache` and scored on the held-out cache (α: the analytic T = 1
    acceptance per position). Seeded by `train_cfg.seed`: the same call trains the same draft."""
    config = inputs.config_for(spec.name, draft_vocab_size)
    vocab, vocab_coverage = inputs.vocabulary(draft_vocab_size) if draft_vocab_size is not None else (None, None)
    torch.manual_seed(train_cfg.seed)
    model = build_draft_model(config)
    if vocab is not None:
        model.set_draft_vocabulary(vocab)
    model.copy_target_embeddings(inputs.target.input_embeddings(), inputs.target.output_embeddings())
    result = train_draft(inputs.cache, model, train_cfg)
    model.eval()
    held = evaluate_draft(inputs.heldout, model, train_cfg)
    model.to(inputs.target.dtype)  # drafts run in the target's dtype; STS is fitted on the model as it will run
    return TrainedDraft(model, result, held, vocab_coverage)


def build_drafts(inputs: DraftInputs, out_dir: str | Path, *, log: Callable[[str], None] = print) -> list[DraftReport]:
    """Train every draft of `inputs` (from `draft_inputs`) and write each to `out_dir/<name>`.

    With a `work_dir` given to `draft_inputs`, the build resumes: the target caches are kept there (keyed by
    everything that makes them), and a draft already in `out_dir` of the same shape, trained with the same config
    on these same caches, is kept, not retrained. A real target's build can outlast a working session (its card alone takes 30–75 min on 2 cores;
    the cache took 45 min in fp32 on shared AVX2 cores, 4 min in bf16 on AMX ones), and losing it to an
    interruption costs the whole build again."""
    p, seed, train_cfg = inputs.preset, inputs.seed, replace(inputs.preset.train, seed=inputs.seed)
    if p.draft_vocab_size is not None:
        _, vocab_coverage = inputs.vocabulary(p.draft_vocab_size)
        log(f"draft vocabulary: {p.draft_vocab_size} of {inputs.target.vocab_size} tokens, "
            f"{100 * vocab_coverage:.2f}% of held-out answer tokens")
    reports = []
    for d in inputs.drafts:
        kept = (_kept_draft(Path(out_dir) / d.name, train_cfg, p.draft_vocab_size,
                            architecture=inputs.config_for(d.name, p.draft_vocab_size),
                            cache_key=inputs.cache_key) if inputs.work_dir is not None else None)
        if kept is not None:
            log(f"{d.name}: kept from an earlier run of this build ({Path(out_dir) / d.name})")
            reports.append(kept)
            continue
        trained = train_one(inputs, d, train_cfg, p.draft_vocab_size)
        model, result, held = trained.model, trained.result, trained.heldout
        temps, offsets = (fit_calibration(inputs.target, model, inputs.tokenizer, inputs.corpus, p, seed)
                          if inputs.configs[d.name].confidence_head else (None, None))
        report = DraftReport(
            name=d.name, method=d.method, head=d.head,
            num_params_trainable=sum(t.numel() for t in model.parameters() if t.requires_grad),
            train_seconds=result.seconds, loss_first=result.losses[0], loss_last=result.losses[-1],
            heldout_loss=float(held.total), heldout_acceptance=float(held.acceptance), sts_temperatures=temps,
            sts_offsets=offsets,
            draft_vocab_size=p.draft_vocab_size, draft_vocab_coverage=trained.vocab_coverage,
            heldout_confidence=trained.heldout_confidence,
        )
        # bf16 on disk and no embeddings (shared with the target): the committed build stays small.
        save_draft(model, Path(out_dir) / d.name, dtype=torch.bfloat16, share_target_embeddings=True,
                   extra={"sts_temperatures": temps, "sts_offsets": offsets, "training": asdict(report),
                          "train_config": _jsonable(asdict(train_cfg)), "target_cache": inputs.cache_key})
        promised = "" if report.heldout_confidence is None else f" (confidence head: {report.heldout_confidence:.3f})"
        log(f"{d.name}: loss {report.loss_first:.3f} → {report.loss_last:.3f}, held-out α {report.heldout_acceptance:.3f}"
            f"{promised}, {report.train_seconds:.0f} s")
        reports.append(report)
    return reports


def choose_vocabulary(answers: Iterable[torch.Tensor | list[int]], corpus: Corpus, tokenizer, size: int,
                      vocab_size: int) -> torch.Tensor:
    """The draft vocabulary: the `size` tokens the target's answers use most (ties: by their count in the whole
    training corpus, then by id), stop tokens always in. The ranking does not depend on `size`, so a smaller
    vocabulary is a subset of a larger one (an ablation trains it from a cache that keeps the larger)."""
    counts = token_counts(answers, vocab_size)
    text = token_counts((tokenizer(part, add_special_tokens=False)["input_ids"]
                         for e in corpus.train for turn in e.turns for part in turn), vocab_size)
    return choose_draft_vocabulary(counts, size, secondary=text, always=stop_tokens(tokenizer))


def answer_tokens(cache: TargetCache) -> Iterator[torch.Tensor]:
    return (s.token_ids[s.prompt_len:] for s in cache.sequences)


def _cache_key(corpus: Corpus, preset: DraftPreset, seed: int, target_dir, layer_ids) -> str:
    """Everything a target cache depends on, hashed: corpus, generation settings, seed, target, dtype, layers."""
    import hashlib
    import json

    what = {"corpus": corpus.fingerprint(), "prompts_per_domain": preset.prompts_per_domain,
            "max_new_tokens": preset.max_new_tokens, "sts_prompts_per_domain": preset.sts_prompts_per_domain,
            "instruction_prompts": preset.instruction_prompts,
            "cache_batch_size": preset.cache_batch_size, "target_dtype": preset.target_dtype, "seed": seed,
            "draft_vocab_size": preset.draft_vocab_size,  # the columns the cache keeps
            "target": str(target_dir), "layer_ids": list(layer_ids), "torch": torch.__version__}
    return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:16]


def _kept(work_dir, name: str, key: str, log, build: Callable[[], TargetCache]) -> TargetCache:
    """The cache `name` from `work_dir` when it was built under `key`, else built now (and kept there)."""
    if work_dir is None:
        return build()
    path = Path(work_dir) / f"target-cache-{name}-{key}.pt"
    if path.exists():
        log(f"target cache {name}: kept from an earlier run of this build ({path})")
        return TargetCache.load(path)
    cache = build()
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    cache.save(partial)
    partial.replace(path)  # whole or absent: an interrupted save is never read back
    return cache


def _kept_draft(directory: Path, train_cfg: TrainConfig, draft_vocab_size: int | None = None, *,
                architecture: DraftConfig | None = None, cache_key: str | None = None) -> DraftReport | None:
    """The report of a draft this build already wrote with the same training config and draft vocabulary size,
    else None. Only the fields that shape this draft's training are compared: an `eagle3_*` field changes no
    DSpark draft. `architecture`: the draft config the build would train now; a written draft of another shape
    (layers, Markov rank, widths, target layers …) is trained again, never kept under the new preset's name.
    `cache_key`: the target caches' key; a draft written without it, or trained on other caches, is trained again."""
    import json

    path = directory / "draft_config.json"
    if not path.exists():
        return None
    written = json.loads(path.read_text())
    if written.get("draft_vocab_size") != draft_vocab_size:
        return None
    extra = written.get("extra", {})
    if "training" not in extra or "train_config" not in extra:
        return None
    if architecture is not None:
        try:  # through the config class, so a field added since the draft was written reads as its default
            written_config = DraftConfig.from_dict(written)
        except (TypeError, ValueError):
            return None
        if _shaping_fields(written_config) != _shaping_fields(architecture):
            return None
    if cache_key is not None and extra.get("target_cache") != cache_key:
        return None
    method = extra["training"].get("method")
    defaults = _jsonable(asdict(TrainConfig()))  # a field added since the draft was written: it trained at the default

    def shaping(config: dict) -> dict:
        return {k: v for k, v in {**defaults, **config}.items() if method == "eagle3" or not k.startswith("eagle3_")}

    if shaping(extra["train_config"]) != shaping(_jsonable(asdict(train_cfg))):
        return None
    return DraftReport(**extra["training"])


def _shaping_fields(config: DraftConfig) -> dict:
    """A draft config's fields that shape its weights: all but `extra`, and the Markov rank only where there is a
    Markov head (DFlash and Eagle3-style record the preset's rank and never read it)."""
    return {k: v for k, v in asdict(config).items() if k != "extra" and not (k == "markov_rank" and config.head == "none")}


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value if isinstance(value, (int, float, str, bool, type(None))) else str(value)
