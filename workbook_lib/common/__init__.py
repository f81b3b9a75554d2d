"""What every floor of the package uses, on the bottom floor (it imports only ``exceptions``):

``files``       atomic writes with the mode ``open`` would give (0666 less the umask)
``locks``       ``flock`` on a lock file, as a context manager
``text``        a message on one line; rows as aligned columns
``device``      the ``device`` param as a ``torch.device``; the host memory a run may use; the
                CPU allocator setting a process applies once
``progress``    progress bars and stage notes on the terminal, never in a report
``processes``   stopping processes we started, whatever state they are in
``argtypes``    the command line's paths and numbers as argparse types, one error each

They are small utilities that the data, training, measurement and running layers all need; kept
here so that none of those reaches up into ``running`` or ``report`` for them.
"""
