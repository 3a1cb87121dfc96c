"""``python -m tools.dump_graph`` from a checkout: the installed ``fuse-attn-dump-graph`` command
(:mod:`fuse_attn.dump_graph`, inside the package so that installing fuse_attn adds no top-level ``tools`` module)."""

import sys

from fuse_attn.dump_graph import main

if __name__ == "__main__":
    sys.exit(main())
