#!/usr/bin/env python3
"""PyTorch's side of scripts/bench.d/gpu: one GPT-2 training step (embedding, L blocks, final
LayerNorm, tied head with the loss, the whole backward, one AdamW update) in fp32 on the GPU,
the step kernels/bench-cuda times through our CUDA twins.

Usage: gpu_torch.py L C NH V T B ITERS ATTN   (ATTN: math = the same algorithm as our twins,
softmax(QK^T)V with the probabilities kept; sdpa = torch's scaled_dot_product_attention)
Prints one line: tokens_per_s=... ms_per_step=<median> ms_min=... ms_max=... params=...
Matrix products in fp32 without TF32, as our twins (CUBLAS_PEDANTIC_MATH). Exit 77 without a
GPU or without torch."""
import math
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("gpu_torch: no torch", file=sys.stderr)
    sys.exit(77)


class Block(nn.Module):
    def __init__(self, C, NH, attn):
        super().__init__()
        self.nh, self.attn = NH, attn
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        if self.attn == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
            att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
            y = att @ v
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, NH, V, T, attn):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, NH, attn) for _ in range(L))
        self.lnf = nn.LayerNorm(C)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # the tied head
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    if len(sys.argv) != 9:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    L, C, NH, V, T, B, iters = (int(a) for a in sys.argv[1:8])
    attn = sys.argv[8]
    if not torch.cuda.is_available():
        print("gpu_torch: no GPU", file=sys.stderr)
        return 77
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(1)
    dev = torch.device("cuda")
    model = GPT(L, C, NH, V, T, attn).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    idx = torch.randint(0, V, (B, T), device=dev)
    tgt = torch.randint(0, V, (B, T), device=dev)

    def step():
        opt.zero_grad(set_to_none=False)
        model(idx, tgt).backward()
        opt.step()

    step()  # warm-up: kernels chosen, memory allocated
    torch.cuda.synchronize()
    ms = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        ms.append(a.elapsed_time(b))
    ms.sort()
    med = ms[len(ms) // 2] if len(ms) % 2 else 0.5 * (ms[len(ms) // 2 - 1] + ms[len(ms) // 2])
    n = sum(p.numel() for p in model.parameters())
    print("tokens_per_s=%.0f ms_per_step=%.3f ms_min=%.3f ms_max=%.3f params=%d" % (
        B * T / (med / 1e3), med, ms[0], ms[-1], n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
