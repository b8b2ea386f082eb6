"""Runner groups: one instance served by runners on several nodes, joined in an mx.distributed
ring.

- the ring hostfile, environment, bounded `init` and membership proof: `exo_core.ring`
  (shared with the image engine).
- `pipeline`: a rank's layers of a llama-like model, passing hidden states on.
- `tensor`: every layer sliced over the ranks (mlx-lm's `Model.shard`).
- `plan`: the per-step plan rank 0 broadcasts (tasks joining and leaving the batch).
- `coordinator`: the request loop of a rank (rank 0 leads, the others follow).
- deadlines that turn a stuck collective into a runner failure: `exo_core.watchdog`.
"""
