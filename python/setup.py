"""Builds the extension with the repository's CMake build, then packages it.

`pip install ./python` configures <repo>/build-python (Release, no tests) and builds the
strata_python target there; set STRATA_BUILD_DIR to an existing build tree of the
repository (e.g. build) to reuse it instead, and STRATA_BUILD_JOBS to limit parallelism.
The package holds strata/_strata*.so and libstrata.so.1 beside it (found through the
module's RPATH $ORIGIN). pip builds a local directory in place, so ../ is the repository.
"""
import glob
import os
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class CMakeBuild(build_ext):
    def build_extension(self, ext):
        if not os.path.exists(os.path.join(ROOT, "include", "strata", "strata.h")):
            raise RuntimeError(f"{ROOT} is not the Strata repository; install with `pip install ./python` from it")
        given = os.environ.get("STRATA_BUILD_DIR")
        build_dir = given or os.path.join(ROOT, "build-python")
        if not os.path.isabs(build_dir):
            build_dir = os.path.join(ROOT, build_dir)
        # build-python, this script's own tree, is configured on every install: pip's isolated
        # build environment (and the pybind11 in it) is a new temporary folder each time. A
        # tree given by STRATA_BUILD_DIR is configured only when it does not exist yet.
        if not given or not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
            # pybind11 from PyPI (pyproject.toml's build requirements), for the Python running
            # pip whatever its version; without it (--no-build-isolation in an environment that
            # lacks it) CMake looks for an installed one (Debian's pybind11-dev).
            pybind11_dir = []
            try:
                import pybind11
                pybind11_dir = [f"-Dpybind11_DIR={pybind11.get_cmake_dir()}"]
            except ImportError:
                pass
            # PYTHON_EXECUTABLE for pybind11's classic FindPythonInterp mode, Python_EXECUTABLE
            # for its FindPython mode (pybind11 3's default).
            subprocess.check_call(["cmake", "-S", ROOT, "-B", build_dir, "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
                                   "-DSTRATA_TESTS=OFF", f"-DSTRATA_PYTHON={sys.executable}",
                                   f"-DPYTHON_EXECUTABLE={sys.executable}", f"-DPython_EXECUTABLE={sys.executable}",
                                   *pybind11_dir])
        jobs = os.environ.get("STRATA_BUILD_JOBS", str(os.cpu_count() or 1))
        subprocess.check_call(["cmake", "--build", build_dir, "--target", "strata_python", "-j", jobs])
        built = os.path.join(build_dir, "python", "strata")
        modules = glob.glob(os.path.join(built, "_strata*.so"))
        if len(modules) != 1:
            raise RuntimeError(f"expected one _strata module in {built}, found {modules}")
        dest = os.path.dirname(os.path.abspath(self.get_ext_fullpath(ext.name)))
        os.makedirs(dest, exist_ok=True)
        shutil.copy2(modules[0], self.get_ext_fullpath(ext.name))
        # The module needs libstrata by its soname; copy the file itself under that name.
        shutil.copy2(os.path.realpath(os.path.join(built, "libstrata.so.1")), os.path.join(dest, "libstrata.so.1"))


setup(ext_modules=[Extension("strata._strata", sources=[])], cmdclass={"build_ext": CMakeBuild})
