"""What commcamp asks Slurm directly (not through ReFrame): the partition's load in a verdict."""
