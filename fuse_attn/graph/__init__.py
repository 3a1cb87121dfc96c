"""The graph side: finding attentions in FX graphs and replacing them with the fused op.

:mod:`~fuse_attn.graph.matching` anchors on each softmax and proves an attention around it, reading the score path
into a score program (:mod:`~fuse_attn.graph.score_reader`) and SDPA calls through their expansion
(:mod:`~fuse_attn.graph.sdpa_calls`); :mod:`~fuse_attn.graph.rewrite` replaces each match (on a sharded sequence, with
the ring of :mod:`~fuse_attn.graph.context_parallel`). :mod:`~fuse_attn.graph.nodes` holds what they share.
"""
