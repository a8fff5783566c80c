#!/usr/bin/env python3
"""make_golden.py: writes tests/golden/gpt-tiny.bin, the PyTorch reference that
tests/unit/kernels/test-golden.c checks our CPU kernels (and, through them, the CUDA twins)
against.

The model is a GPT-2 decoder laid out exactly as kernels/kernels.h lays it out (layer 0 =
wte, wpe; layers 1..L = blocks with ln1.w ln1.b qkv.w qkv.b attproj.w attproj.b ln2.w ln2.b
fc.w fc.b fcproj.w fcproj.b; layer L+1 = lnf.w lnf.b; LM head tied to wte). Parameters are
not GPT-2's init: they are drawn here with numpy from a fixed seed, wider than GPT-2's init so
that LayerNorm, attention and GELU work away from their linear regime, and written into the
file, so the C side needs no generator of its own.

Two training steps, fp32: forward, mean cross-entropy, backward, global-norm gradient clipping
(torch.nn.utils.clip_grad_norm_), torch.optim.AdamW with weight decay only on 2-D tensors and
the learning rate of each step given explicitly (what kern_lr would return). Each step uses its
own batch. The file format is documented in tests/golden/README.md.

Run through scripts/make-golden, which provides a venv with torch and numpy.
"""
import argparse
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

MAGIC = 20261123  # "spottrain golden"
VERSION = 1
NAME_LEN = 48
HEADER_INTS = 256
HYPER_DOUBLES = 32
ATOL, RTOL = 1e-6, 1e-5  # the tolerance test-golden.c applies
COND_MIN = 1e-6          # AdamW's direction is fixed by the data only where |g| >= this
ENTRY = struct.Struct("<48sii4iqq")  # name, dtype, ndim, shape[4], offset (bytes), numel

BLOCK = [("ln1.w", "C"), ("ln1.b", "C"), ("qkv.w", "3C,C"), ("qkv.b", "3C"),
         ("attproj.w", "C,C"), ("attproj.b", "C"), ("ln2.w", "C"), ("ln2.b", "C"),
         ("fc.w", "4C,C"), ("fc.b", "4C"), ("fcproj.w", "C,4C"), ("fcproj.b", "C")]


def shape_of(spec, C):
    dims = []
    for d in spec.split(","):
        dims.append(int(d[:-1] or 1) * C if d.endswith("C") else int(d))
    return tuple(dims)


def layer_tensors(cfg):
    """[(layer, name, shape)] in kernels.h order."""
    L, C, V, T = cfg["L"], cfg["C"], cfg["V"], cfg["T"]
    out = [(0, "wte", (V, C)), (0, "wpe", (T, C))]
    for l in range(1, L + 1):
        out += [(l, n, shape_of(s, C)) for n, s in BLOCK]
    out += [(L + 1, "lnf.w", (C,)), (L + 1, "lnf.b", (C,))]
    return out


def init_params(cfg, rng):
    params = {}
    for layer, name, shape in layer_tensors(cfg):
        if name.startswith("ln") and name.endswith(".w"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith(".b"):
            a = 0.05 * rng.standard_normal(shape)
        else:
            a = 0.1 * rng.standard_normal(shape)
        params[(layer, name)] = a.astype(np.float32)
    return params


def forward(cfg, P, idx, targets):
    """Logits and mean loss. P maps (layer, name) -> tensor."""
    L, C, NH = cfg["L"], cfg["C"], cfg["NH"]
    B, T = idx.shape
    hs = C // NH
    x = P[(0, "wte")][idx] + P[(0, "wpe")][:T]
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for l in range(1, L + 1):
        g = lambda n: P[(l, n)]
        h = F.layer_norm(x, (C,), g("ln1.w"), g("ln1.b"), eps=1e-5)
        qkv = h @ g("qkv.w").T + g("qkv.b")
        q, k, v = qkv.split(C, dim=2)  # llm.c: q, k, v blocks of C, heads contiguous in each
        q = q.view(B, T, NH, hs).transpose(1, 2)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / (hs ** 0.5))
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        x = x + (y @ g("attproj.w").T + g("attproj.b"))
        h = F.layer_norm(x, (C,), g("ln2.w"), g("ln2.b"), eps=1e-5)
        h = F.gelu(h @ g("fc.w").T + g("fc.b"), approximate="tanh")
        x = x + (h @ g("fcproj.w").T + g("fcproj.b"))
    x = F.layer_norm(x, (C,), P[(L + 1, "lnf.w")], P[(L + 1, "lnf.b")], eps=1e-5)
    logits = x @ P[(0, "wte")].T
    loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))
    return logits, loss


def train(cfg, hyper, params0, batches, dtype):
    """Runs the two steps; returns a dict of numpy arrays to store."""
    keys = [(l, n) for l, n, _ in layer_tensors(cfg)]
    P = {k: torch.tensor(params0[k], dtype=dtype, requires_grad=True) for k in keys}
    decay = [P[k] for k in keys if P[k].dim() == 2]
    no_decay = [P[k] for k in keys if P[k].dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": hyper["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=hyper["lr"][0], betas=(hyper["beta1"], hyper["beta2"]),
                            eps=hyper["eps"], foreach=False)
    out = {}
    losses, norms = [], []
    for step, batch in enumerate(batches):
        idx = torch.tensor(batch[:, :-1], dtype=torch.long)
        tgt = torch.tensor(batch[:, 1:], dtype=torch.long)
        opt.zero_grad(set_to_none=True)
        logits, loss = forward(cfg, P, idx, tgt)
        loss.backward()
        if step == 0:
            out["logits"] = logits.detach()
        for k in keys:  # before clipping
            out["g%d.L%d.%s" % ((step + 1,) + k)] = P[k].grad.detach().clone()
        norm = torch.nn.utils.clip_grad_norm_([P[k] for k in keys], hyper["grad_clip"],
                                              foreach=False)
        losses.append(loss.item())
        norms.append(norm.item())
        for group in opt.param_groups:
            group["lr"] = hyper["lr"][step]
        opt.step()
        for k in keys:
            out["p%d.L%d.%s" % ((step + 1,) + k)] = P[k].detach().clone()
    out["loss"] = torch.tensor(losses)
    out["gradnorm"] = torch.tensor(norms)
    return {k: v.to(torch.float64).numpy() for k, v in out.items()}


def write_golden(path, cfg, hyper, params0, batches, ref):
    tensors = [("tokens", np.asarray(batches, dtype=np.int32))]
    for layer, name, _ in layer_tensors(cfg):
        tensors.append(("p0.L%d.%s" % (layer, name), params0[(layer, name)]))
    for k in sorted(ref):
        tensors.append((k, ref[k].astype(np.float32)))
    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[:12] = [MAGIC, VERSION, cfg["L"], cfg["C"], cfg["NH"], cfg["V"], cfg["T"], cfg["B"],
                len(batches), len(tensors), NAME_LEN, HYPER_DOUBLES]
    hyp = np.zeros(HYPER_DOUBLES, dtype="<f8")
    hyp[:7] = [hyper["lr"][0], hyper["lr"][1], hyper["beta1"], hyper["beta2"], hyper["eps"],
               hyper["weight_decay"], hyper["grad_clip"]]
    table_at = HEADER_INTS * 4 + HYPER_DOUBLES * 8
    data_at = table_at + ENTRY.size * len(tensors)
    entries, blobs, off = [], [], (data_at + 63) // 64 * 64
    for name, a in tensors:
        assert len(name) < NAME_LEN, name
        a = np.ascontiguousarray(a)
        dt = 1 if a.dtype == np.int32 else 0
        a = a.astype("<i4" if dt else "<f4")
        shape = list(a.shape) + [1] * (4 - a.ndim)
        entries.append(ENTRY.pack(name.encode(), dt, a.ndim, *shape, off, a.size))
        blobs.append((off, a.tobytes()))
        off = (off + a.nbytes + 63) // 64 * 64
    with open(path, "wb") as f:
        f.write(hdr.tobytes())
        f.write(hyp.tobytes())
        for e in entries:
            f.write(e)
        for at, b in blobs:
            f.write(b"\0" * (at - f.tell()))
            f.write(b)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default="tests/golden/gpt-tiny.bin")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    cfg = {"L": 2, "C": 32, "NH": 4, "V": 64, "T": 16, "B": 4}
    hyper = {"lr": [1e-3, 2e-3], "beta1": 0.9, "beta2": 0.95, "eps": 1e-8,
             "weight_decay": 0.1, "grad_clip": 1.0}
    rng = np.random.default_rng(args.seed)
    params0 = init_params(cfg, rng)
    batches = rng.integers(0, cfg["V"], size=(2, cfg["B"], cfg["T"] + 1)).astype(np.int32)

    ref = train(cfg, hyper, params0, batches, torch.float32)
    ref64 = train(cfg, hyper, params0, batches, torch.float64)
    # How far fp32 PyTorch itself is from exact arithmetic, under the C test's rule
    # (|a - r| <= ATOL + RTOL |r|; p1/p2 only where both steps' gradients are >= COND_MIN):
    # the noise our own fp32 rounding adds to is of the same size.
    noise = {}
    for k in ref:
        group = k.split(".")[0]
        d = np.abs(ref[k] - ref64[k])
        bad = d > ATOL + RTOL * np.abs(ref64[k])
        if group in ("p1", "p2"):
            rest = k.split(".", 1)[1]
            bad &= (np.abs(ref["g1." + rest]) >= COND_MIN) & (np.abs(ref["g2." + rest]) >= COND_MIN)
        n = noise.setdefault(group, [0.0, 0, 0])
        n[0] = max(n[0], float(d.max()))
        n[1] += int(bad.sum())
        n[2] += d.size
    write_golden(args.out, cfg, hyper, params0, batches, ref)
    print("wrote %s: L=%d C=%d NH=%d V=%d T=%d B=%d, %d steps" %
          (args.out, cfg["L"], cfg["C"], cfg["NH"], cfg["V"], cfg["T"], cfg["B"], len(batches)))
    print("loss %s, grad norm %s (clip %g)" % (ref["loss"], ref["gradnorm"], hyper["grad_clip"]))
    print("torch %s; fp32 against fp64 per group: max |d|, elements outside the test's "
          "tolerance (atol %g, rtol %g)" % (torch.__version__, ATOL, RTOL))
    for g in sorted(noise):
        print("  %-8s %.3g  %d of %d" % (g, noise[g][0], noise[g][1], noise[g][2]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
