"""What the GPU machine gets and what it is: the bundle carried to it (bundle, wheel_parts,
layout), the install there (install), the data it reads (data) and what it has (environment)."""
