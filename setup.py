"""The classic entry point, for tools and habits that still run it (``python setup.py --version``).
Everything is declared in pyproject.toml, which setuptools reads here as it does for ``pip install``."""

from setuptools import setup

setup()
