"""Package metadata is in setup.cfg; this file only declares the optional C speedup.

cdc._render (cdc/_render.c) renders the Kafka publisher's records in C. It is optional: without
a C compiler the install still succeeds and the pure-Python path is used (scripts/setup.sh then
prints a warning, and `cdc stream` says it renders in pure Python).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("cdc._render", ["cdc/_render.c"], optional=True, extra_compile_args=["-O2", "-Wall"])
    ]
)
