"""Slots: where a model's tensors live (POSIX shared memory, its header, GPU memory), the
slot pools that hand them out in one process and across a node, and the specs they are laid
out for."""
