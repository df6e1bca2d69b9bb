"""A DataLoader whose batches outgrow /dev/shm: what a real PyTorch job prints when it dies of it.

Run inside a container with the runtime's default 64 MiB /dev/shm (scripts/replay/torch.sh).
"""
import sys

import torch
from torch.utils.data import DataLoader, Dataset


class Big(Dataset):
    """Each item is `mib` MiB of float32: the worker hands it over through /dev/shm."""

    def __init__(self, mib: int):
        self.n = mib * 1024 * 1024 // 4

    def __len__(self):
        return 64

    def __getitem__(self, i):
        return torch.full((self.n,), float(i))


def main():
    mib = int(sys.argv[1]) if len(sys.argv) > 1 else 24
    print(f"torch {torch.__version__}: batches of 2 x {mib} MiB through 2 workers", flush=True)
    loader = DataLoader(Big(mib), batch_size=2, num_workers=2, prefetch_factor=2)
    for step, batch in enumerate(loader):
        print(f"step {step}: {batch.numel() * 4 >> 20} MiB", flush=True)
    print("done", flush=True)


if __name__ == "__main__":
    main()
