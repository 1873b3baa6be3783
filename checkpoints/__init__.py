"""The checkpoint format, below training and serving: how a directory of checkpoints is
laid out and which of them counts (`directory`), saving into it (`save`), one verified
open of a checkpoint (`opened`), loading it into live state (`load`), what state is
restored besides tensors (`state`), what the ranks share meanwhile (`collective`), all
through torch.distributed.checkpoint on iopath (`storage`), with its ``meta.json``
(`meta`) and DCP's ``.metadata`` read without running code (`dcp_metadata`). Training decides which checkpoint a run
starts from and when it saves (training/checkpoint_policy.py); serving loads one to
export. Nothing here imports training or serving (tests/common/test_config_flags.py).
"""
