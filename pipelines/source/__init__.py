"""The source at one consistent point, read inside an exported snapshot and never blocking
writers: the point itself and verify's marker (``consistent``), the counts a ``GROUP BY``
gives (``truth``), gold's baseline (``baseline``) and the mirrors' initial rows
(``mirror_baseline``)."""
