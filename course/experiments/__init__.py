"""The lessons' experiments: plain ``torch.distributed`` programs that decide each quiz key.

Each runs on the launcher's ranks from a notebook or a test, and under ``torchrun`` as it is
(``torchrun --nproc-per-node 2 -m course.experiments.ddp``).
"""
