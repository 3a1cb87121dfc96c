"""The generated Triton kernels: :mod:`.codegen` fills the readable templates in ``templates/`` from a spec (its score
program written in), :mod:`.launch` launches them (from Inductor's output code under torch.compile, through
``wrap_triton``), :mod:`.decode` runs the split-K decode forward."""
