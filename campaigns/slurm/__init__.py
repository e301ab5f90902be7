"""What commcamp asks Slurm itself, not through ReFrame: preflight and node state, the network topology and
placements, the partition's load in a verdict, srun launchers and sbatch tuning workers."""
