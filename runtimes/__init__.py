"""Hand-off to Slurm: oci.conf templates, scrun.lua hooks, sbatch/srun --container."""
