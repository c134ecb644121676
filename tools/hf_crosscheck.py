#!/usr/bin/env python3
"""
hf_crosscheck.py - lmserv against Hugging Face's own libraries.

Builds small random checkpoints with transformers (Llama, Mistral, Qwen2,
Qwen3; F32 and BF16; one file and sharded; tied and untied heads), a
byte-level BPE tokenizer.json with the `tokenizers` library (GPT-2, Llama 3
and Qwen2 pre-tokenizers), and LoRA adapters with peft, then compares:

  * logits of every position: transformers' forward pass vs
    `lmserv eval -m FOLDER` (CPU, and `--gpu-layers all` with --gpu);
  * the same with a PEFT adapter: peft's model vs `lmserv eval --lora DIR`;
  * token ids: the tokenizer's encode() vs `lmserv tokenize --no-bos`;
  * the chat template: apply_chat_template() vs `lmserv template -m FOLDER`.

Needs python3 with torch, transformers, peft and tokenizers (the GPU
machine has them; CI and the build machine do not, so this is a tool, not
a test). Prints one line per check and exits 1 if any fails.

    tools/hf_crosscheck.py --lmserv build/lmserv --work /tmp/hfx [--gpu]
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
import zlib

import numpy as np
import torch

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

# the pre-tokenizer patterns of Llama 3's and Qwen2's tokenizer.json
CL100K_HEAD = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
CL100K_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
RE_LLAMA3 = CL100K_HEAD + r"\p{N}{1,3}" + CL100K_TAIL
RE_QWEN2 = CL100K_HEAD + r"\p{N}" + CL100K_TAIL

WORDS = ("the cat sat on a mat while 42 dogs ran past 1999 quiet houses; "
         "café naïve Zürich über 東京 北京 😀 🚀 don't we'll it's I'M "
         "hello world! foo_bar(baz) = [1, 2, 3] {\"k\": \"v\"} tab\there\n"
         "newline\r\n x+y^2 <tag> 3.14159 1,000,000 Ω≈ç√").split(" ")

SAMPLES = [
    "Hello world",
    " leading space and  two   spaces",
    "numbers 1234567 and 3.14 and 1,000",
    "café naïve Zürich über",
    "東京 and 北京 😀🚀",
    "don't we'll it's I'M HE'S",
    "line one\nline two\r\n\n\ttabbed",
    "foo_bar(baz) = [1, 2, 3]; {\"k\": \"v\"}",
    "<|begin|>special in text<|end|>",
    "",
    "   ",
]

TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}"
            "{{ eos_token }}\n{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")

failures = 0


def report(ok, what, detail=""):
    global failures
    if not ok:
        failures += 1
    print(("PASS " if ok else "FAIL ") + what + ("  " + detail if detail else ""), flush=True)


def corpus():
    rng = np.random.default_rng(1)
    out = []
    for _ in range(3000):
        n = int(rng.integers(3, 14))
        out.append(" ".join(WORDS[int(i)] for i in rng.integers(0, len(WORDS), n)))
    return out


def make_tokenizer(kind):
    tok = Tokenizer(models.BPE(ignore_merges=(kind == "llama3")))
    if kind == "gpt2":
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    else:
        pat = RE_LLAMA3 if kind == "llama3" else RE_QWEN2
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pat), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<|begin|>", "<|end|>", "<|pad|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    return tok


def save_tokenizer(tok, folder):
    from transformers import PreTrainedTokenizerFast
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|begin|>", eos_token="<|end|>",
                                   pad_token="<|pad|>")
    fast.chat_template = TEMPLATE
    fast.save_pretrained(folder)
    return fast


def make_model(arch, vocab, tie, seed):
    import transformers as tf
    common = dict(vocab_size=vocab, hidden_size=256, intermediate_size=512, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  rms_norm_eps=1e-5, tie_word_embeddings=tie, initializer_range=0.08,
                  bos_token_id=0, eos_token_id=1)
    if arch == "llama":
        cfg, cls = tf.LlamaConfig(rope_theta=10000.0, **common), tf.LlamaForCausalLM
    elif arch == "mistral":
        cfg, cls = tf.MistralConfig(rope_theta=1000000.0, sliding_window=None, **common), \
            tf.MistralForCausalLM
    elif arch == "qwen2":
        cfg, cls = tf.Qwen2Config(rope_theta=1000000.0, **common), tf.Qwen2ForCausalLM
    else:
        cfg, cls = tf.Qwen3Config(rope_theta=1000000.0, head_dim=64, **common), tf.Qwen3ForCausalLM
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = cls(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.6, 1.4)
            elif name.endswith(".bias"):
                p.normal_(0.0, 0.1)
    return model


def ref_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def lms_logits(lmserv, folder, ids, extra, vocab, work):
    out = os.path.join(work, "lms.f32")
    cmd = [lmserv, "eval", "-m", folder, "--tokens", " ".join(map(str, ids)), "--logits", out,
           "--all-positions"] + extra
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        return None, r.stderr.strip()[-400:]
    a = np.fromfile(out, dtype=np.float32)
    if a.size != len(ids) * vocab:
        return None, f"{a.size} floats, expected {len(ids)} x {vocab}"
    return a.reshape(len(ids), vocab), ""


def compare(what, ref, got, err, tol):
    if got is None:
        report(False, what, err)
        return
    diff = float(np.max(np.abs(ref - got)))
    top = float(np.mean(np.argmax(ref, axis=1) == np.argmax(got, axis=1)))
    scale = float(np.max(np.abs(ref)))
    report(diff <= tol, what, f"max|diff| {diff:.3g} (logits up to {scale:.3g}), top-1 {top:.0%}")


def check_tokenizer(lmserv, folder, fast, label):
    bad = []
    for s in SAMPLES:
        want = fast.encode(s, add_special_tokens=False)
        r = subprocess.run([lmserv, "tokenize", "-m", folder, "--no-bos", "--special", s],
                           capture_output=True,
                           text=True)
        got = [int(x) for x in r.stdout.split()] if r.returncode == 0 else None
        if got != want:
            bad.append(f"{s!r}: lmserv {got if got is not None else r.stderr.strip()} vs {want}")
    report(not bad, f"{label}: tokenize {len(SAMPLES)} strings", "; ".join(bad[:3]))


def check_template(lmserv, folder, fast, work, label):
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    want = fast.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    path = os.path.join(work, "msgs.json")
    with open(path, "w") as f:
        json.dump(msgs, f)
    r = subprocess.run([lmserv, "template", "-m", folder, "--messages", path], capture_output=True,
                       text=True)
    got = r.stdout if r.returncode == 0 else None
    if got is not None and got.endswith("\n") and not want.endswith("\n"):
        got = got[:-1]
    report(got == want, f"{label}: chat template", "" if got == want else
           f"lmserv {got!r} ({r.stderr.strip()[-200:]}) vs {want!r}")


def check_peft(lmserv, model, folder, ids, vocab, work, label, rslora):
    from peft import LoraConfig, get_peft_model
    cfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, init_lora_weights=False,
                     use_rslora=rslora,
                     target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                     "up_proj", "down_proj"])
    torch.manual_seed(7)
    pm = get_peft_model(model, cfg).eval()
    adir = os.path.join(work, label + "-lora")
    pm.save_pretrained(adir)
    ref = ref_logits(pm, ids)
    got, err = lms_logits(lmserv, folder, ids, ["--lora", adir], vocab, work)
    compare(f"{label}: PEFT LoRA{' (rsLoRA)' if rslora else ''} logits", ref, got, err, 2e-2)


def run_case(args, arch, tok_kind, tie, dtype, shard):
    label = f"{arch}/{tok_kind}/{'tied' if tie else 'untied'}/{dtype}{'/sharded' if shard else ''}"
    folder = os.path.join(args.work, label.replace("/", "-"))
    shutil.rmtree(folder, ignore_errors=True)
    os.makedirs(folder)
    tok = make_tokenizer(tok_kind)
    fast = save_tokenizer(tok, folder)
    vocab = tok.get_vocab_size()
    model = make_model(arch, vocab, tie, seed=zlib.crc32(label.encode()) % 1000)
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
    model.save_pretrained(folder, safe_serialization=True, max_shard_size="600KB" if shard else "10GB")
    model = model.float()
    text = "the cat sat on a mat while 42 dogs ran past café 東京 😀 hello world! " * 2
    ids = [0] + fast.encode(text, add_special_tokens=False)[:60]
    ref = ref_logits(model, ids)
    # bf16 weights: llama.cpp and lmserv round the activations to bf16 too
    tol = 2e-2 if dtype == "f32" else 0.1
    got, err = lms_logits(args.lmserv, folder, ids, ["-t", "4"], vocab, args.work)
    compare(f"{label}: logits CPU ({len(ids)} positions)", ref, got, err, tol)
    if args.gpu:
        got, err = lms_logits(args.lmserv, folder, ids, ["--gpu-layers", "all"], vocab, args.work)
        compare(f"{label}: logits GPU", ref, got, err, tol)
    if not shard and dtype == "f32":
        check_tokenizer(args.lmserv, folder, fast, label)
        check_template(args.lmserv, folder, fast, args.work, label)
        check_peft(args.lmserv, model, folder, ids, vocab, args.work, label.replace("/", "-"),
                   rslora=(arch == "qwen3"))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lmserv", default="build/lmserv")
    ap.add_argument("--work", default="/tmp/hf_crosscheck")
    ap.add_argument("--gpu", action="store_true", help="also run with --gpu-layers all")
    args = ap.parse_args()
    os.makedirs(args.work, exist_ok=True)
    torch.set_num_threads(4)
    cases = [
        ("llama", "llama3", False, "f32", False),
        ("llama", "llama3", False, "bf16", True),
        ("mistral", "gpt2", False, "f32", False),
        ("qwen2", "qwen2", True, "f32", False),
        ("qwen2", "qwen2", True, "bf16", True),
        ("qwen3", "qwen2", True, "f32", False),
        ("qwen3", "qwen2", False, "bf16", False),
    ]
    for c in cases:
        try:
            run_case(args, *c)
        except Exception as e:  # a case that breaks is a failure, the others still run
            report(False, "/".join(map(str, c)), f"{type(e).__name__}: {e}")
    print(f"{failures} failed", flush=True)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
