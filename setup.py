"""The compiled core (tide/format/_ccore.c; docs/performance.md, "The compiled core").

Everything else about the package is in pyproject.toml. ``TIDE_NO_EXTENSIONS=1`` at
build time skips the extension (as aiokafka's ``AIOKAFKA_NO_EXTENSIONS`` does); at run
time it makes Tide use the pure-Python path even when the extension is built.
"""

import os

from setuptools import Extension, setup

extensions = []
if os.environ.get("TIDE_NO_EXTENSIONS", "") in ("", "0"):
    extensions.append(
        Extension(
            "tide.format._ccore",
            sources=["tide/format/_ccore.c"],
            depends=["tide/format/_crc32.h"],  # the body CRC (included by _ccore.c)
            libraries=["z"],  # crc32: the zlib that Python's zlib module uses
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Werror=implicit"],
        )
    )

setup(ext_modules=extensions)
