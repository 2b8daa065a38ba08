"""Stand-ins for other projects' norm classes, for tests/test_replace.py: written here from what each original
computes (read from its source, named in each file), with the original's class name, parameter names and
shapes, and eps. Each file is one original file, because the eps of some is their file's module-level EPS."""
