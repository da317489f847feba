"""The running pipeline: every stage in one process (``pipeline``), the one streaming query
bronze → silver → gold (``stream``), the mirrors' query (``mirrors``, with ``markers``: the
verify markers it passed), how a command stops (``signals``) and how a stage waits for its
input on a first start (``inputs``)."""
