"""The DALI backend. Importing this package imports ``nvidia.dali``; the factory only does so
when ``backend="dali"`` is asked for."""
