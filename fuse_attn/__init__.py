"""fuse_attn: ``torch.compile(model, backend="fuse_attn")`` fuses every attention into a generated Triton flash kernel."""
