"""The ground floor: typed errors (``errors``), frozen options and YAML (``config``),
rank-prefixed logs (``logs``), the CUDA driver's checked call (``cuda_driver``), NVRTC's
(``nvrtc``), every ``IPCSHARE_*`` setting read in one place (``settings``), owned file
descriptors (``owned_fd``), the one way a finalizer releases and warns (``finalizers``),
the check that an output file can be written (``output_files``), the result document's
schema (``result_document``) and the commit that runs (``source_commit``). Importing this
package loads nothing heavy: each module is imported by name where it is needed."""
