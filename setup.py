"""mqspark: transactional message queues on Delta tables for Apache Spark."""

from setuptools import find_packages, setup

setup(
    name="mqspark",
    version="0.1.0",
    description="Transactional message queues (IBM MQ / Tuxedo /Q semantics) on Delta tables for Apache Spark",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["mqspark", "mqspark.*"]),
    python_requires=">=3.11,<3.12",
    install_requires=[
        "pyspark==4.2.0",
        # delta-spark 4.4.1 is on PyPI but its JVM artifact (delta-spark_4.2_2.13:4.4.1) is not on
        # Maven Central; 4.4.0 is the newest pair whose Python package and jars both exist.
        "delta-spark==4.4.0",
        "deltalake>=1.6.6,<1.7",
        "pyarrow>=21,<27",
        "pandas>=2.2,<3",
        "numpy>=2,<3",
    ],
    extras_require={
        "dev": [
            "pytest>=8",
            "chispa==0.12.0",
            "hypothesis>=6.100",
            "ruff>=0.6",
            "nbclient>=0.10",
            "nbformat>=5.10",
            "ipykernel>=6.29",
            # The monitoring notebook plots the monitor history.
            "matplotlib>=3.9",
            # The Spark Connect tests run a sc:// client.
            "pyspark[connect]==4.2.0",
            # The S3 tests run moto's S3 server, which answers conditional puts.
            "moto[server]==5.2.5",
        ],
    },
    entry_points={"console_scripts": ["mqspark=mqspark.cli:entry"]},
)
