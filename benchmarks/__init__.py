"""mqspark benchmarks: each compares an mqspark path with the native Delta path in the same run."""
