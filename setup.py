"""Build of the native suffix-tree core; everything else is declared in pyproject.toml."""

from pybind11.setup_helpers import Pybind11Extension, build_ext
from setuptools import setup

ext_modules = [
    Pybind11Extension(
        "suffixcache._native",
        [
            "suffixcache/csrc/bindings.cpp",
            "suffixcache/csrc/suffix_tree.cpp",
            "suffixcache/csrc/calibrator.cpp",
        ],
        include_dirs=["suffixcache/csrc"],
        cxx_std=17,
        extra_compile_args=["-O3"],
    ),
]

setup(ext_modules=ext_modules, cmdclass={"build_ext": build_ext})
