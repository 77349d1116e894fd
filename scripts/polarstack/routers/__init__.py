"""Router releases: the catalog of what each release does, installing and running a release, the worker API."""
