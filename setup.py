"""The one compiled part: feedlog.log._blake2batch (the Merkle fold, get's read, the timestamp scan), optional.

Everything else is in pyproject.toml. A machine without a C compiler still installs
feedlog; merkle, core and entry_scan then run their Python paths, the references the tests
compare the extension against.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "feedlog.log._blake2batch",
            ["feedlog/log/_blake2batch.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
