"""``ipcshare vs-torch``: what a PyTorch user sees. ipcshare's collectives against NCCL
through torch.distributed on the same CUDA tensors, in one launch: the rows and their sizes
(``plan``), the exact values every call must leave (``expected``), the run on the GPUs
(``runner``), its own timer and second clock (``clock``), the checks of each row
(``rows``) and the Markdown (``table``)."""
