from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [Extension("incr._core", ["incr/_core.pyx"]),
         Extension("incr._codec", ["incr/_codec.pyx"]),
         Extension("incr._collections", ["incr/_collections.pyx"])],
        compiler_directives={"language_level": "3"},
    )
)
