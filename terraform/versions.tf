terraform {
  # 1.9 is the first release whose variable validation may refer to other
  # variables: gpu_count is checked against machine_type in variables.tf.
  required_version = ">= 1.9, < 2.0"

  required_providers {
    google = {
      source = "hashicorp/google"
      # 6.x and 7.x both carry every argument used here (7.0 changed nothing
      # in the container, compute network or IAM resources this module uses);
      # the upper bound keeps a future major release from arriving unreviewed.
      version = ">= 6.0, < 8.0"
    }
  }
}
