"""The engine: iterators that run a DataLoader's epoch in the main process or in workers."""
