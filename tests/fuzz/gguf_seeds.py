#!/usr/bin/env python3
"""Writes small but complete GGUF files (a 1-layer llama with F32 weights and
a 48-token vocab: byte-level BPE with merges, or SentencePiece with scores)
into the folder given, as seeds for fuzz_gguf: the test data's vocab files
are too large for the fuzzer, and cut short they never reach the loaders."""
import struct
import sys

ALIGN = 32


def s(x):
    b = x.encode()
    return struct.pack('<Q', len(b)) + b


def kv(key, vt, v):
    out = s(key) + struct.pack('<I', vt)
    if vt == 8:
        return out + s(v)
    if vt == 9:
        et, items = v
        out += struct.pack('<IQ', et, len(items))
        for it in items:
            out += s(it) if et == 8 else struct.pack({4: '<I', 5: '<i', 6: '<f'}[et], it)
        return out
    return out + struct.pack({4: '<I', 6: '<f', 7: '<?'}[vt], v)


def model(tok_kvs, n_vocab):
    e, ff, heads, kvh, hd = 8, 16, 2, 1, 4
    kvs = [kv('general.architecture', 8, 'llama'),
           kv('llama.context_length', 4, 64), kv('llama.embedding_length', 4, e),
           kv('llama.block_count', 4, 1), kv('llama.feed_forward_length', 4, ff),
           kv('llama.attention.head_count', 4, heads),
           kv('llama.attention.head_count_kv', 4, kvh),
           kv('llama.rope.dimension_count', 4, hd), kv('llama.vocab_size', 4, n_vocab),
           kv('llama.rope.freq_base', 6, 10000.0),
           kv('llama.attention.layer_norm_rms_epsilon', 6, 1e-5)] + tok_kvs
    tensors = [('token_embd.weight', (e, n_vocab)), ('blk.0.attn_norm.weight', (e,)),
               ('blk.0.attn_q.weight', (e, heads * hd)), ('blk.0.attn_k.weight', (e, kvh * hd)),
               ('blk.0.attn_v.weight', (e, kvh * hd)),
               ('blk.0.attn_output.weight', (heads * hd, e)), ('blk.0.ffn_norm.weight', (e,)),
               ('blk.0.ffn_gate.weight', (e, ff)), ('blk.0.ffn_up.weight', (e, ff)),
               ('blk.0.ffn_down.weight', (ff, e)), ('output_norm.weight', (e,)),
               ('output.weight', (e, n_vocab))]
    info, data = b'', b''
    for name, dims in tensors:
        n = 1
        for d in dims:
            n *= d
        info += s(name) + struct.pack('<I', len(dims)) + b''.join(struct.pack('<Q', d) for d in dims)
        info += struct.pack('<IQ', 0, len(data))
        data += struct.pack('<%df' % n, *[((i * 7) % 13 - 6) / 16 for i in range(n)])
        data += b'\0' * (-len(data) % ALIGN)
    head = b'GGUF' + struct.pack('<IQQ', 3, len(tensors), len(kvs)) + b''.join(kvs) + info
    return head + b'\0' * (-len(head) % ALIGN) + data


def main():
    out = sys.argv[1]
    # byte-level BPE: printable ASCII letters, a few merges, specials
    letters = [chr(c) for c in range(ord('a'), ord('z') + 1)] + ['Ġ', 'Ċ', '0', '1']
    merged = ['ab', 'Ġa', 'Ġab', 'he', 'll', 'hell', 'hello', 'Ġw']
    toks = letters + merged + ['<s>', '</s>', '<|eot|>', '[UNK]']
    merges = ['a b', 'Ġ a', 'Ġa b', 'h e', 'l l', 'he ll', 'hell o', 'Ġ w']
    bpe = [kv('tokenizer.ggml.model', 8, 'gpt2'), kv('tokenizer.ggml.pre', 8, 'default'),
           kv('tokenizer.ggml.tokens', 9, (8, toks)),
           kv('tokenizer.ggml.token_type', 9, (5, [1] * (len(toks) - 4) + [3, 3, 3, 2])),
           kv('tokenizer.ggml.merges', 9, (8, merges)),
           kv('tokenizer.ggml.bos_token_id', 4, len(toks) - 4),
           kv('tokenizer.ggml.eos_token_id', 4, len(toks) - 3),
           kv('tokenizer.ggml.add_bos_token', 7, True),
           kv('tokenizer.chat_template', 8, "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}")]
    open(out + '/tiny-bpe.gguf', 'wb').write(model(bpe, len(toks)))
    # SentencePiece: <unk> <s> </s>, byte tokens for a few bytes, pieces with scores
    pieces = ['<unk>', '<s>', '</s>', '<0x0A>', '<0x41>', '▁', '▁h', '▁he', 'll', 'o', 'e', 'h', 'l',
              '▁hello', 'w', 'r', 'd', '▁w', 'or', '▁world']
    types = [2, 3, 3, 6, 6] + [1] * (len(pieces) - 5)
    spm = [kv('tokenizer.ggml.model', 8, 'llama'), kv('tokenizer.ggml.tokens', 9, (8, pieces)),
           kv('tokenizer.ggml.scores', 9, (6, [-float(i) for i in range(len(pieces))])),
           kv('tokenizer.ggml.token_type', 9, (5, types)),
           kv('tokenizer.ggml.bos_token_id', 4, 1), kv('tokenizer.ggml.eos_token_id', 4, 2),
           kv('tokenizer.ggml.unknown_token_id', 4, 0)]
    open(out + '/tiny-spm.gguf', 'wb').write(model(spm, len(pieces)))


main()
