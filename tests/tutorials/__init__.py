"""The reference's tutorials, run as written (side by side with tensordict 0.15.3 where they
print values)."""
