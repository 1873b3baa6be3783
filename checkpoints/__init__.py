"""The checkpoint format, below training and serving: how a checkpoint is laid out,
saved, found, verified and loaded (`store`), through torch.distributed.checkpoint on
iopath (`storage`), with its ``meta.json`` (`meta`) and DCP's ``.metadata`` read
without running code (`dcp_metadata`). Training decides which checkpoint a run starts
from and when it saves (training/checkpoint_policy.py); serving loads one to export.
Nothing here imports training or serving (tests/test_config_flags.py).
"""
