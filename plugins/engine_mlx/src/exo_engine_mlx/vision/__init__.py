"""Images in chat requests: a vision tower (mlx-vlm's modules) beside mlx-lm's language model.

The language model runs exactly as for text (batching, prefix cache, pipeline split). An
image becomes a run of *virtual token ids* past the vocabulary, one id per soft token, fixed
by the image's content: the embedding layer (`VisionEmbedding`) turns those ids into the
tower's features. So requests with images batch beside text ones, and the prefix cache,
keyed by token ids, is keyed by image content for free.
"""
