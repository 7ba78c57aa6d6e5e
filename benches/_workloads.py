"""The benchmark rows: what each workload measures, its unit, its limit and its target.

No torch import here: ``report.py`` renders a saved JSON file without paying for it.
"""

from __future__ import annotations

from dataclasses import dataclass

REF = "tensordict"  # tensordict 0.15.3, the reference
RS = "tensordict_rs"  # this package
LIMIT = "limit"  # the same work done by the machine's fastest plain method
CASES = (REF, RS, LIMIT)


@dataclass(frozen=True)
class Workload:
    id: str
    title: str
    unit: str  # "GB/s" (amount = bytes), "us/leaf" (leaves), "M rows/s" (rows), "s", "outcome"
    limit: str  # what the limit case does ("" when there is none)
    target: str  # the target, as text
    min_ratio: float | None = None  # reference time / tensordict_rs time
    min_fraction: float | None = None  # limit time / tensordict_rs time
    max_value: float | None = None  # absolute bound in the unit (us/leaf, s)
    absolute_is_alternative: bool = False  # max_value is shown beside the ratio, not required
    absolute_if_ref_fails: bool = False  # where the reference fails, max_value alone decides
    max_fds: int | None = None  # most new descriptors tensordict_rs may take (entry["fds"])
    info: bool = False  # context row, no target


WORKLOADS: tuple[Workload, ...] = (
    Workload(
        "w1_save_shm",
        "memmap_(prefix) W1: 1 GiB in 4 leaves, /dev/shm",
        "GB/s",
        "write(2) of the same bytes, 2 threads x 2 files",
        ">= 1.6x the reference and >= 0.9 of the limit",
        min_ratio=1.6,
        min_fraction=0.9,
    ),
    Workload(
        "w1_save_anon",
        "anonymous memmap_() W1: 1 GiB in 4 leaves",
        "GB/s",
        "write(2) of the same bytes, 2 threads x 2 memfds",
        ">= 1.6x",
        min_ratio=1.6,
    ),
    Workload(
        "w3_save_shm",
        "memmap_(prefix) W3: 10,000 x 1 KiB leaves, /dev/shm",
        "us/leaf",
        "write(2) of the same bytes, 2 threads x 2 files",
        ">= 8x (<= 5 µs/leaf)",
        min_ratio=8.0,
        max_value=5.0,
        absolute_is_alternative=True,
    ),
    Workload(
        "w3_save_tmp",
        "memmap_(prefix) W3: 10,000 x 1 KiB leaves, /tmp (ext4)",
        "us/leaf",
        "write(2) of the same bytes, 2 threads x 2 files",
        ">= 3x",
        min_ratio=3.0,
    ),
    Workload(
        "w3_load",
        "load_memmap W3: 10,000 leaves, /dev/shm",
        "us/leaf",
        "open + read(2) + close of every leaf file",
        ">= 5x",
        min_ratio=5.0,
    ),
    Workload(
        "w3_load_get",
        "load_memmap W3 + get every leaf tensor (context: lazy leaves)",
        "us/leaf",
        "open + read(2) + close of every leaf file",
        "(context)",
        info=True,
    ),
    Workload(
        "w3_like",
        "memmap_like W3: 10,000 leaves, /dev/shm",
        "us/leaf",
        "torch.empty_like per leaf (no files)",
        ">= 8x",
        min_ratio=8.0,
    ),
    Workload(
        "w3f_save_shm",
        "memmap_(prefix) flat: 10,000 x 1 KiB leaves in one TensorDict, /dev/shm",
        "us/leaf",
        "write(2) of the same bytes, 2 threads x 2 files",
        ">= 10x",
        min_ratio=10.0,
    ),
    Workload(
        "w3f_load",
        "load_memmap flat: 10,000 leaves in one directory, /dev/shm",
        "us/leaf",
        "open + read(2) + close of every leaf file",
        ">= 5x",
        min_ratio=5.0,
    ),
    Workload(
        "w3f_like",
        "memmap_like flat: 10,000 leaves, /dev/shm",
        "us/leaf",
        "torch.empty_like per leaf (no files)",
        ">= 8x",
        min_ratio=8.0,
    ),
    Workload(
        "w1_like_sparse",
        "memmap_like(reserve=False) W1: 1 GiB in 4 leaves, sparse files (as the reference)",
        "GB/s",
        "torch.empty_like per leaf (no files)",
        ">= 1.0x (sparse on request costs what the reference's does)",
        min_ratio=1.0,
    ),
    Workload(
        "w1_like_reserved",
        "memmap_like() W1: 1 GiB in 4 leaves, space reserved (the default: no SIGBUS)",
        "GB/s",
        "torch.empty_like per leaf (no files)",
        "(context: reserving 1 GiB is paid once)",
        info=True,
    ),
    Workload(
        "w1_load_read",
        "load_memmap + first read of every byte, W1 1 GiB, /dev/shm",
        "GB/s",
        "reading the resident source tensors",
        ">= 1.0x",
        min_ratio=1.0,
    ),
    Workload(
        "w4_batches",
        "random 256-row batches td[idx], W4 12 KiB rows, /dev/shm",
        "M rows/s",
        "torch.index_select(out=) into preallocated tensors, same mapping",
        ">= 2.5x and >= 0.9 of the limit",
        min_ratio=2.5,
        min_fraction=0.9,
    ),
    Workload(
        "b50k_batches",
        "random 256-row batches td[idx] from 50,000 rows (W4 layout, 12 KiB rows), /dev/shm",
        "M rows/s",
        "plain parallel copy of the same rows: 2 threads, index_select(out=) of half each",
        ">= 2.5x and >= 0.9 of the limit",
        min_ratio=2.5,
        min_fraction=0.9,
    ),
    Workload(
        "w4_batches_out",
        "random 256-row batches, W4: ours td.index_select(0, idx, out=buf) vs reference td[idx]",
        "M rows/s",
        "torch.index_select(out=) into preallocated tensors, same mapping",
        ">= 1.8x (the training-loop form)",
        min_ratio=1.8,
    ),
    Workload(
        "dist_consolidated",
        "gloo send(consolidated=True) W3: 10,000 x 1 KiB leaves, from a plain tree into a tree "
        "in one buffer (ours: from_remote_init's; the reference's: consolidated)",
        "us/leaf",
        "one tensor of the same bytes (dist.send)",
        "<= 1.2x one tensor (fraction >= 0.83)",
        min_fraction=1 / 1.2,
    ),
    Workload(
        "dist_consolidated_plain",
        "gloo send(consolidated=True) W3, plain tree to plain tree (context: the receiver "
        "scatters into 10,000 leaves)",
        "us/leaf",
        "one tensor of the same bytes (dist.send)",
        "(context)",
        info=True,
    ),
    Workload(
        "dist_memmap",
        "gloo send(consolidated=True) W3 memmap_()'d (anonymous) into a memmap_()'d tree (context)",
        "us/leaf",
        "one tensor of the same bytes (dist.send)",
        "(context: no pack or scatter; the reference's tree mapped under a prefix)",
        info=True,
    ),
    Workload(
        "dist_per_leaf",
        "gloo send() per-leaf protocol (default), 200 x 1 KiB leaves",
        "us/leaf",
        "one tensor of the same bytes (dist.send)",
        ">= 1.0x (no slower than the reference)",
        min_ratio=1.0,
    ),
    Workload(
        "dist_init_remote",
        "gloo init_remote + from_remote_init W3: 10,000 x 1 KiB leaves",
        "us/leaf",
        "one later send(consolidated=True) into the received tree",
        "<= 2x one later send (fraction >= 0.5)",
        min_fraction=0.5,
    ),
    Workload(
        "dist_init_fresh",
        "gloo init_remote + from_remote_init W3, a tree never sent before (context)",
        "us/leaf",
        "one later send(consolidated=True) into the received tree",
        "(context: the first contact of a new tree)",
        info=True,
    ),
    Workload(
        "import",
        "import after torch (fresh processes, interleaved)",
        "s",
        "python -c 'import torch' alone",
        "<= 0.1 s",
        max_value=0.1,
    ),
    Workload(
        "cli_info",
        "tensordict-rs info of W3: 10,000 leaves in 100 sub-trees, whole command (fresh "
        "processes; reference: load_memmap + print)",
        "s",
        "python -c pass (interpreter start-up alone)",
        "<= 0.1 s, interpreter start included",
        max_value=0.1,
    ),
    Workload(
        "fd_limit",
        "anonymous memmap_ of 10,000 leaves, RLIMIT_NOFILE 1,024",
        "outcome",
        "",
        "works",
    ),
    Workload(
        "dl_w0",
        "DataLoader, random 256-row batches of a memory-mapped dataset (64 leaves), 0 workers",
        "batches/s",
        "",
        ">= 2x",
        min_ratio=2.0,
    ),
    Workload(
        "dl_w2",
        "DataLoader, random 256-row batches of a memory-mapped dataset (64 leaves), 2 workers",
        "batches/s",
        "",
        ">= 5x",
        min_ratio=5.0,
    ),
    Workload(
        "dl_w4",
        "DataLoader, random 256-row batches of a memory-mapped dataset (64 leaves), 4 workers",
        "batches/s",
        "",
        "(measured, no target: 4 workers on 2 CPUs)",
        info=True,
    ),
    Workload(
        "spawn_10k",
        "a spawned child receives a 10,000-leaf anonymous tree over a Queue (new fds in the child)",
        "s",
        "",
        "<= 10% of the reference's time (< 0.1 s where it fails), <= 4 new fds",
        min_ratio=10.0,
        max_value=0.1,
        absolute_if_ref_fails=True,
        max_fds=4,
    ),
    Workload(
        "big1_save_shm",
        "memmap_(prefix) one big leaf: 1 GiB in one leaf + 3 small, /dev/shm",
        "GB/s",
        "fastest plain method: write(2) 1 thread or pwrite(2) 2 threads, +/- fallocate",
        ">= 0.9 of the fastest plain method",
        min_fraction=0.9,
    ),
    Workload(
        "big1_save_tmp",
        "memmap_(prefix) one big leaf: 1 GiB in one leaf + 3 small, temp dir (ext4)",
        "GB/s",
        "fastest plain method: write(2) 1 thread or pwrite(2) 2 threads, +/- fallocate",
        ">= 0.9 of the fastest plain method",
        min_fraction=0.9,
    ),
    Workload(
        "big1_resave_tmp",
        "memmap_(prefix, existsok=True) over the same tree, one big leaf 1 GiB, temp dir (ext4)",
        "GB/s",
        "fastest plain method into a new file: write(2) 1 thread or pwrite(2) 2 threads, "
        "+/- fallocate",
        ">= 0.9 of the fastest plain method (the reference overwrites in place)",
        min_fraction=0.9,
    ),
    Workload(
        "big1_tdz_tmp",
        "memmap(prefix.tdz) one big leaf: 1 GiB in one leaf + 3 small, temp dir (ext4)",
        "GB/s",
        "fastest plain method: write(2) 1 thread or pwrite(2) 2 threads, +/- fallocate",
        ">= 0.9 of the fastest plain method",
        min_fraction=0.9,
    ),
    Workload(
        "big1_verify_tdz",
        "verify(prefix.tdz): every CRC-32 of a 1 GiB one-leaf archive, temp dir (ext4)",
        "GB/s",
        "read(2) of every byte of the archive, 1 thread",
        "(measured: no reference; one thread's CRC beside it)",
        info=True,
    ),
    Workload(
        "ctx_memcpy",
        "memcpy between resident buffers, np.copyto, 2 threads (context)",
        "GB/s",
        "np.copyto, 2 threads",
        "(context)",
        info=True,
    ),
    Workload(
        "ray_put_64",
        "ray.put of a consolidated tree: 64 leaves, 256 MiB",
        "GB/s",
        "ray.put of one uint8 NumPy array of the same bytes (one copy into the store)",
        ">= 0.83 of the limit (within 1.2x of one copy)",
        min_fraction=0.83,
    ),
    Workload(
        "ray_get_64",
        "ray.get of that tree, same node (resident memory growth per get)",
        "s",
        "ray.get of the NumPy array (a view of the store)",
        "< 1 ms, no copy",
        max_value=0.001,
    ),
    Workload(
        "ray_put_w1",
        "ray.put of a consolidated tree: W1, 1 GiB in 4 leaves",
        "GB/s",
        "ray.put of one uint8 NumPy array of the same bytes (one copy into the store)",
        ">= 0.83 of the limit (within 1.2x of one copy)",
        min_fraction=0.83,
    ),
    Workload(
        "ray_get_w1",
        "ray.get of that tree, same node (resident memory growth per get)",
        "s",
        "ray.get of the NumPy array (a view of the store)",
        "< 1 ms, no copy",
        max_value=0.001,
    ),
    Workload(
        "ray_rt_w3",
        "ray.get(ray.put(td)) of W3: 10,000 x 1 KiB leaves",
        "us/leaf",
        "the same bytes as one NumPy array",
        ">= 20x",
        min_ratio=20.0,
    ),
    Workload(
        "tdz_w3_save",
        ".tdz save W3: 10,000 x 1 KiB leaves in 100 groups, /dev/shm",
        "us/leaf",
        "our own directory save (memmap_ to a directory) of the same tree",
        ">= 20x the reference's .tdz save and faster than our directory save",
        min_ratio=20.0,
        min_fraction=1.0,
    ),
    Workload(
        "tdz_w3_load",
        "load_memmap of a .tdz, W3: 10,000 leaves, /dev/shm",
        "us/leaf",
        "one read(2) of the whole archive",
        ">= 5x",
        min_ratio=5.0,
    ),
    Workload(
        "tdz_w1_save",
        ".tdz save W1: 1 GiB in 4 leaves (CRC-32 included), /dev/shm",
        "GB/s",
        "write(2) of the same bytes, 2 threads x 2 files",
        ">= 1.6x",
        min_ratio=1.6,
    ),
    Workload(
        "tdz_w1_load_read",
        "load_memmap of a .tdz + first read of every byte, W1 1 GiB, /dev/shm",
        "GB/s",
        "reading the resident source tensors",
        ">= 1.0x",
        min_ratio=1.0,
    ),
    Workload(
        "tc_loading",
        "DataLoader over a memory-mapped tensorclass (tensorclass_imagenet's loop), batches of 128",
        "M rows/s",
        "the same loop over a tensordict_rs TensorDict of the same data",
        ">= 3x the reference; the tensorclass >= 0.9 of the TensorDict",
        min_ratio=3.0,
        min_fraction=0.9,
    ),
    Workload(
        "map_w2",
        "map(fn, num_workers=2, out=memmap_like) of a 1 GiB memmap dataset, /dev/shm",
        "GB/s",
        "fn applied serially in one process, written into a preallocated memmap",
        ">= 2x the reference and <= 1.2x the limit's time",
        min_ratio=2.0,
        min_fraction=1 / 1.2,
    ),
    Workload(
        "weights_rt",
        "from_module(model).memmap(dir) + load_memmap(dir).to_module(model2) + read, 1 GiB model",
        "GB/s",
        "torch.save(state_dict) + torch.load(mmap=True) + load_state_dict(assign=True) + read",
        "context (issue 23 names no target)",
        info=True,
    ),
    Workload(
        "weights_rt_safetensors",
        "the same round trip of the 1 GiB model against safetensors",
        "GB/s",
        "safetensors save_file + load_file + load_state_dict(assign=True) + read",
        "context (issue 23 names no target)",
        info=True,
    ),
)

BY_ID = {w.id: w for w in WORKLOADS}
