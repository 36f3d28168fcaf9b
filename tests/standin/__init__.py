"""Stand-ins for the GPU's measurements, installed in a papermill kernel by sitecustomize.py (this folder on
PYTHONPATH, ATTNLAB_STANDIN naming the module): the real notebooks then render their GPU path on a CPU from rows
whose values the tests know."""
