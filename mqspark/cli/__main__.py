"""``python -m mqspark.cli``: the ``mqspark`` command."""

from mqspark.cli.main import entry

if __name__ == "__main__":
    entry()
