"""Helpers of the test suite, not tests: the object stores the tests run against (Azurite, moto's
S3 server), a Spark standalone cluster and the spark-submit job it runs, starting and killing
drivers and servers, running the ``mqspark`` command in this process or as a process, storage
outages, sample queue contents, the service functions the forwarder tests run, the reference model
of the spec's ordering, reading a streaming get's batches directly, checks that an error changes
nothing, and recording a function's calls."""
