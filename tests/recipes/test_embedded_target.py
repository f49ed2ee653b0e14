"""The embedded target: tokenizer, chat template, corpus, and a tiny end-to-end training run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from recipes.embedded.corpus import (CODE_INSTRUCTION, DOMAINS, MATH_INSTRUCTION, CorpusCaps, build_corpus,
                                     gsm8k_solution)
from recipes.embedded.target import (PRESETS, TargetPreset, batches, load_report, lr_at, tokenize_examples,
                                     train_target)
from recipes.embedded.tokenizer import (CHAT_TEMPLATE, SPECIAL_TOKENS, render_chat, to_hf_tokenizer,
                                        train_tokenizer)

SMALL_CAPS = CorpusCaps(40_000, 40_000, 40_000, num_val=6)
TINY = TargetPreset(
    name="tiny", vocab_size=512, hidden_size=64, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=16,
    intermediate_size=128, caps=SMALL_CAPS, seq_len=128, batch_size=8, max_steps=40, lr=3e-3, min_lr=3e-4,
    max_minutes=2.0, eval_batch_size=8, log_every=1000, sample_tokens=4,
)


@pytest.fixture(scope="module")
def data_dir() -> Path:
    repo_root = Path(__file__).resolve().parents[2]
    path = Path(os.environ.get("HARNESS_DATA_DIR") or repo_root.parent / "shared" / "datasets")
    if not (path / "gsm8k" / "train.jsonl").exists():
        pytest.skip(f"no GSM8K under {path} (set HARNESS_DATA_DIR)")
    return path


@pytest.fixture(scope="module")
def corpus(data_dir):
    return build_corpus(data_dir, SMALL_CAPS)


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_tokenizer((f"{u}\n{a}" for ex in corpus.train for u, a in ex.turns), vocab_size=512)


# ---- tokenizer and chat template --------------------------------------------------------------------


def test_tokenizer_round_trips_text_and_special_tokens(tokenizer):
    assert tokenizer.get_vocab_size() == 512
    assert [tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    text = ('<|im_start|>user\ndef f(x):\n    """Dört ünïcode 😀 \\boxed{42}"""\n\treturn x  # 3.14'
            "<|im_end|>\n<|mask|><|mask|><|endoftext|>")
    enc = tokenizer.encode(text)
    assert tokenizer.decode(enc.ids, skip_special_tokens=False) == text
    assert enc.ids.count(tokenizer.token_to_id("<|mask|>")) == 2  # one id each, never split into bytes


def test_tokenizer_training_is_deterministic(corpus, tokenizer):
    again = train_tokenizer((f"{u}\n{a}" for ex in corpus.train for u, a in ex.turns), vocab_size=512)
    assert again.to_str() == tokenizer.to_str()


def test_chat_template_matches_render_chat(tokenizer):
    hf = to_hf_tokenizer(tokenizer)
    assert hf.mask_token_id == 3 and hf.eos_token_id == 0 and hf.pad_token_id == 0
    prompt = hf.apply_chat_template([{"role": "user", "content": "Hi?"}], add_generation_prompt=True, tokenize=False)
    assert prompt == "<|im_start|>user\nHi?<|im_end|>\n<|im_start|>assistant\n"  # no system prompt injected
    assert render_chat([("Hi?", None)], add_generation_prompt=True) == (prompt, [])

    turns = [("Explain x.", "x is a letter."), ("Tell me more.", "It comes after w.")]
    messages = [{"role": r, "content": c} for u, a in turns for r, c in (("user", u), ("assistant", a))]
    text, spans = render_chat(turns)
    assert hf.apply_chat_template(messages, tokenize=False) == text
    assert [text[lo:hi] for lo, hi in spans] == ["x is a letter.<|im_end|>\n", "It comes after w.<|im_end|>\n"]
    assert hf.chat_template == CHAT_TEMPLATE


# ---- corpus ------------------------------------------------------------------------------------------


def test_gsm8k_solution_rewrites_final_line():
    answer = "She sold 48/2 = <<48/2=24>>24 clips.\nIn all 48+24 = <<48+24=72>>72.\n#### 1,072"
    assert gsm8k_solution(answer) == "She sold 48/2 = 24 clips.\nIn all 48+24 = 72.\n\\boxed{1072}"


def test_corpus_is_deterministic_and_has_three_domains(corpus, data_dir):
    assert build_corpus(data_dir, SMALL_CAPS).fingerprint() == corpus.fingerprint()
    stats = corpus.stats()
    for domain in DOMAINS:
        assert stats[domain]["train_examples"] > 0 and stats[domain]["val_examples"] == SMALL_CAPS.num_val
        assert 40_000 <= stats[domain]["train_chars"] < 40_000 + 6_000  # capped, balanced
    train_keys = {e.key for e in corpus.train}
    assert not train_keys & {e.key for d in DOMAINS for e in corpus.val[d]}

    by_domain = {d: [e for e in corpus.train if e.domain == d] for d in DOMAINS}
    for ex in by_domain["math"]:
        (user, answer), = ex.turns
        assert user.endswith(MATH_INSTRUCTION) and answer.rsplit("\n", 1)[-1].startswith("\\boxed{")
        assert "<<" not in answer and "####" not in answer
    for ex in by_domain["code"]:
        (user, function), = ex.turns
        head = user.removeprefix(CODE_INSTRUCTION + "\n")
        assert user.startswith(CODE_INSTRUCTION) and function.startswith(head.rstrip("\n"))
        assert function.lstrip().startswith(("def ", "async def "))
        compile(function, ex.key, "exec")  # a whole, valid function
    assert any(len(ex.turns) == 2 for ex in by_domain["chat"])  # two-turn dialogues, like MT-Bench


def test_loss_mask_covers_exactly_the_replies(corpus, tokenizer):
    examples = [e for e in corpus.train if len(e.turns) == 2][:3] + list(corpus.train[:3])
    for ex, tokenized in zip(examples, tokenize_examples(tokenizer, examples)):
        produced = tokenizer.decode([int(i) for i, m in zip(tokenized.ids, tokenized.loss_mask) if m],
                                    skip_special_tokens=False)
        expected = "".join(f"{a}<|im_end|>\n" for _, a in ex.turns) + "<|endoftext|>"
        assert produced == expected


def test_batches_are_seeded(corpus, tokenizer):
    data = tokenize_examples(tokenizer, corpus.train)
    first = [next(iter(batches(data, 64, 4, seed=s)))[0] for s in (0, 0, 1)]
    assert first[0].equal(first[1]) and not first[0].equal(first[2])
    x, y = next(iter(batches(data, 64, 4, seed=0)))
    assert x.shape == y.shape == (4, 64)
    inner = y[:, :-1]  # targets are the next inputs (or -100 off the replies)
    assert ((inner == -100) | (inner == x[:, 1:])).all() and (inner != -100).any()


def test_lr_schedule():
    p = PRESETS["default"]
    assert lr_at(p, 0.0) == 0.0 and lr_at(p, p.warmup_frac) == pytest.approx(p.lr)
    assert lr_at(p, 1.0) == pytest.approx(p.min_lr) and lr_at(p, 0.5) < lr_at(p, 0.3)


def test_presets_are_deep_enough_for_drafts():
    from dspark_core.target import default_target_layer_ids

    for p in PRESETS.values():
        assert len(default_target_layer_ids(p.num_layers)) >= 2  # drafts read several target layers
        assert p.num_heads % p.num_kv_heads == 0 and p.head_dim % 32 == 0


# ---- a tiny training run, end to end -----------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("embedded") / "target"
    # One thread: at this size a second one only adds synchronisation, and on a busy CI box it can make
    # the run ten times slower.
    report = train_target(out, data_dir=data_dir, seed=0, preset=TINY, num_threads=1, log=lambda m: None)
    return out, report


def test_training_lowers_validation_loss_in_every_domain(trained):
    out, report = trained
    assert set(report.val_loss) == set(DOMAINS)
    for d in DOMAINS:
        assert report.val_loss[d] < report.val_loss_init[d] - 0.3, (d, report.val_loss_init, report.val_loss)
    assert report.num_steps == TINY.max_steps and not report.time_limited
    assert report.tokens_seen == TINY.max_steps * TINY.batch_size * TINY.seq_len
    assert load_report(out)["val_loss"] == report.val_loss


def test_saved_directory_loads_with_transformers_and_generates(trained):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, _ = trained
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                 "special_tokens_map.json", "generation_config.json", "training_report.json"):
        assert (out / name).is_file(), name
    assert not list(out.parent.glob(".*partial*"))
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["tie_word_embeddings"] is False and config["mask_token_id"] == 3

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert tok.mask_token == "<|mask|>" and tok.convert_tokens_to_ids("<|mask|>") == config["mask_token_id"]
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    assert tok.decode(ids[0]).endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        gen = model.generate(ids, max_new_tokens=8, do_sample=False)
    assert gen.shape[1] > ids.shape[1]
    assert set(model.generation_config.eos_token_id) == {tok.convert_tokens_to_ids("<|im_end|>"), tok.eos_token_id}
    state = model.state_dict()
    assert not torch.equal(state["model.embed_tokens.weight"], state["lm_head.weight"])  # untied


def test_saved_target_serves_as_speculative_target(trained):
    import torch
    from dspark_core.target import TargetModel

    out, _ = trained
    target = TargetModel.from_pretrained(out, layer_ids=(1, 2))
    assert target.num_layers == TINY.num_layers
    cache = target.new_cache(num_slots=1, capacity=32)
    ids = torch.tensor([[1, 10, 11, 12]])
    result = target.forward(cache, torch.tensor([0]), ids, torch.tensor([4]))
    assert result.features.shape == (1, 4, len(target.layer_ids) * TINY.hidden_size)
