"""Package metadata is in setup.cfg; this file only declares the optional C speedup.

cdc._render (cdc/_render.c) renders row images to envelope JSON for the Kafka publisher. It is
optional: without a C compiler the install still succeeds and the pure-Python path is used
(scripts/setup.sh says so loudly; `cdc doctor`-style checks: `python -c "import cdc._render"`).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("cdc._render", ["cdc/_render.c"], optional=True, extra_compile_args=["-O2", "-Wall"])
    ]
)
