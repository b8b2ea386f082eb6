"""Runner groups: one instance served by runners on several nodes, joined in an mx.distributed
ring.

- `group`: the ring hostfile and environment, and a bounded `init`.
- `pipeline`: a rank's layers of a llama-like model, passing hidden states on.
- `tensor`: every layer sliced over the ranks (mlx-lm's `Model.shard`).
- `plan`: the per-step plan rank 0 broadcasts (tasks joining and leaving the batch).
- `coordinator`: the request loop of a rank (rank 0 leads, the others follow).
- `watchdog`: deadlines that turn a stuck collective into a runner failure.
"""
