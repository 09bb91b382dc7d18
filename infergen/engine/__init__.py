"""Engine: requests, scheduler (continuous batching), runner, sampler, step loop."""
