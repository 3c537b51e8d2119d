#!/usr/bin/env python3
"""The peers' attention on this GPU: PyTorch's SDPA backends (FlashAttention-2, cuDNN) and
FlexAttention, timed as `sjit bench attention` times ours, so both can run in one call on one machine.

Usage (on a machine with PyTorch and a GPU; scripts/device-peers.sh runs it beside our bench):
  python3 scripts/peers.py [--batch 2 --heads 16 --seq 8192 --d 128] [--causal]
                           [--pattern FILE ...] [--iters 20] [--peers fa2,cudnn,flex]
Each --pattern is a sparsejit pattern file (`sjit pattern build random --seq 8192 --density 0.1 -o F`
makes the one `sjit bench attention --density 0.1` runs: the same seed); FlexAttention runs it as a
BlockMask of the same blocks. Without --pattern only dense attention runs.

For every case: the forward and the step (forward + backward through autograd, the gradients returned,
not accumulated), each timed alone (events around one call, median of --iters after warm-up: the
host's launch time included, as `sjit bench attention` without --queued) and queued (--iters calls
enqueued back to back between two events, as in a training loop, like --queued). TFLOP/s count the
forward's 4 B H S^2 D over the active blocks (causal: the allowed (query, key) pairs).
"""
import argparse
import array
import statistics
import struct
import sys


def load_pattern(path):
    """A sparsejit pattern file (docs/patterns.md, "File format (version 1)"): its block size, its
    heads, rows and columns, and the active key blocks of every row. The checksum is not verified
    here (sjit wrote the file on this machine)."""
    data = open(path, "rb").read()
    if data[:8] != b"SJITBSR\0":
        sys.exit(f"peers.py: {path} is not a sparsejit pattern file (no SJITBSR magic)")
    version, block = struct.unpack_from("<II", data, 8)
    if version != 1:
        sys.exit(f"peers.py: {path} has format version {version}; this script reads version 1")
    rows, cols = struct.unpack_from("<qq", data, 16)
    (heads,) = struct.unpack_from("<I", data, 32)
    (nnz,) = struct.unpack_from("<q", data, 36)
    row_count = heads * rows
    if len(data) != 44 + 4 * (row_count + 1) + 4 * nnz + 8:
        sys.exit(f"peers.py: {path} is truncated or corrupt ({len(data)} bytes)")
    row_ptr = array.array("i", data[44:44 + 4 * (row_count + 1)])
    col_idx = array.array("i", data[44 + 4 * (row_count + 1):44 + 4 * (row_count + 1) + 4 * nnz])
    if sys.byteorder != "little":
        row_ptr.byteswap()
        col_idx.byteswap()
    active = [list(col_idx[row_ptr[r]:row_ptr[r + 1]]) for r in range(row_count)]
    return {"block": block, "heads": heads, "rows": rows, "cols": cols, "nnz": nnz, "active": active}


def timed(torch, fn, iters, warmup=3):
    """(alone, queued) milliseconds: the median of `iters` calls each between two events, and the mean
    of `iters` calls enqueued back to back."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    alone = []
    for _ in range(iters):
        start.record()
        fn()
        stop.record()
        stop.synchronize()
        alone.append(start.elapsed_time(stop))
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return statistics.median(alone), start.elapsed_time(stop) / iters


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--causal", action="store_true", help="top-left causal masking, dense only")
    parser.add_argument("--pattern", action="append", default=[], help="a sparsejit pattern file (repeatable)")
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--peers", default="fa2,cudnn,flex", help="which peers: fa2, cudnn, flex (default all)")
    args = parser.parse_args()
    peers = args.peers.split(",")
    for peer in peers:
        if peer not in ("fa2", "cudnn", "flex"):
            sys.exit(f"peers.py: --peers {args.peers}: '{peer}' is not one of fa2, cudnn, flex")
    for name in ("batch", "heads", "seq", "d", "iters"):
        if getattr(args, name) < 1:
            sys.exit(f"peers.py: --{name} {getattr(args, name)}: must be at least 1")
    if args.causal and args.pattern:
        sys.exit("peers.py: --causal runs dense attention only; leave out --pattern")
    patterns = [(path, load_pattern(path)) for path in args.pattern]  # (refused before torch loads)

    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    import torch.nn.functional as F

    b, h, s, d = args.batch, args.heads, args.seq, args.d
    device = torch.device("cuda")
    gen = torch.Generator(device=device).manual_seed(2026)
    def tensor():
        return torch.randn(b, h, s, d, device=device, dtype=torch.bfloat16, generator=gen)
    q, k, v, d_o = tensor(), tensor(), tensor(), tensor()
    q.requires_grad_(), k.requires_grad_(), v.requires_grad_()
    print(f"# {torch.cuda.get_device_name()}, PyTorch {torch.__version__}; B{b} H{h} S{s} D{d} bf16"
          f"{', causal top-left' if args.causal else ''}; --iters {args.iters}")
    print("| peer | case | forward alone | queued | TFLOP/s (queued) | step alone | queued |")
    print("|---|---|---|---|---|---|---|")

    def report(peer, case, attend, active_share):
        flops = 4.0 * b * h * s * s * d * active_share
        fwd_alone, fwd_queued = timed(torch, lambda: attend(q, k, v), args.iters)
        def step():
            out = attend(q, k, v)
            torch.autograd.grad(out, (q, k, v), d_o)
        step_alone, step_queued = timed(torch, step, args.iters)
        print(f"| {peer} | {case} | {fwd_alone:.3f} ms | {fwd_queued:.3f} ms | {flops / fwd_queued / 1e9:.0f} "
              f"| {step_alone:.3f} ms | {step_queued:.3f} ms |", flush=True)

    dense_share = (s + 1) / (2 * s) if args.causal else 1.0
    case = "dense causal" if args.causal else "dense"
    for key, peer, backend in (("fa2", "FlashAttention-2", SDPBackend.FLASH_ATTENTION),
                               ("cudnn", "cuDNN", SDPBackend.CUDNN_ATTENTION)):
        if key in peers:
            def attend(q, k, v, backend=backend):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
            try:
                report(peer, case, attend, dense_share)
            except RuntimeError as error:  # a backend this build or GPU lacks
                print(f"| {peer} | {case} | not available: {str(error).splitlines()[0][:80]} | | | | |")

    if "flex" not in peers:
        return
    flex = torch.compile(flex_attention)
    dense_mask = None
    if args.causal:
        dense_mask = create_block_mask(lambda b_, h_, qi, ki: qi >= ki, None, None, s, s, device=device)
    report("FlexAttention", case, lambda q, k, v: flex(q, k, v, block_mask=dense_mask), dense_share)
    for path, p in patterns:
        if p["rows"] * p["block"] < s or p["cols"] * p["block"] < s or p["heads"] not in (1, h):
            sys.exit(f"peers.py: {path}: {p['heads']} heads of {p['rows']} x {p['cols']} blocks of {p['block']}"
                     f" does not fit H{h} S{s}")
        blocks = torch.zeros(p["heads"], p["rows"], p["cols"], dtype=torch.bool)
        for r, cols in enumerate(p["active"]):
            blocks[r // p["rows"], r % p["rows"], cols] = True
        blocks = blocks.to(device)
        bs, per_head = p["block"], p["heads"] > 1
        def block_of(b_, h_, qi, ki, blocks=blocks, bs=bs, per_head=per_head):
            return blocks[h_ if per_head else 0, qi // bs, ki // bs]
        mask = create_block_mask(block_of, None, h if per_head else None, s, s, device=device, BLOCK_SIZE=bs)
        share = p["nnz"] / (p["heads"] * p["rows"] * p["cols"])
        report("FlexAttention", f"{path} (density {share:.3f})",
               lambda q, k, v, mask=mask: flex(q, k, v, block_mask=mask), share)


if __name__ == "__main__":
    main()
