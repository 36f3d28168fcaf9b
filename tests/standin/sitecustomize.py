"""Python imports this at start-up when tests/standin is on PYTHONPATH: it installs the stand-in that
ATTNLAB_STANDIN names (a dotted module with an install() function), so a papermill kernel a test starts measures
through it. Nothing in attnlab reads ATTNLAB_STANDIN."""
import importlib
import os

if os.environ.get("ATTNLAB_STANDIN"):
    importlib.import_module(os.environ["ATTNLAB_STANDIN"]).install()
