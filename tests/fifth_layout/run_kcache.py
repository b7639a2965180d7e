"""kcache with the objcache layout registered: what adding its LayoutShape to `shapes.SHAPES` in the
source tree does, done at run time before anything derives names from the registry."""

import sys

from kcache_cli import layouts
from kcache_cli.layouts import shapes

# nothing derived yet
assert "kcache_cli.model.terms" not in sys.modules and "kcache_cli.catalog.names" not in sys.modules
OBJCACHE = shapes.LayoutShape("objcache", (
    shapes.KindShape("object", "objects/{hash}", target="cpu", patterns=(("hash", r"[0-9a-f]{16}"),)),
), "objects/<hash>/")
shapes.SHAPES = (*shapes.SHAPES, OBJCACHE)
shapes.BY_NAME[OBJCACHE.name] = OBJCACHE
layouts.NAMES = tuple(s.name for s in shapes.SHAPES)
sys.path.insert(0, sys.path[0])  # this directory: `objcache.py` is found as kcache_cli.layouts.objcache
layouts.__path__.append(sys.path[0])

from kcache_cli.cli.app import main  # noqa: E402

main()
