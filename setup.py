"""The one compiled part: feedlog.log._blake2batch (batch Merkle hashing), optional.

Everything else is in pyproject.toml. A machine without a C compiler still installs
feedlog; merkle.py then hashes with hashlib, the reference the tests compare against.
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
