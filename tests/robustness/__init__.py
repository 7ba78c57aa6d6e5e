"""What must not break: killed saves, hostile and damaged directories and archives, fuzzing,
full disks, concurrent saves and loads, failed saves, and attacks over torch.distributed."""
