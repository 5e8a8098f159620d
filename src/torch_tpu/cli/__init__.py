"""The torch-tpu command line."""
