# Values derived from the variables only (no resources), so that
# tests/infra can evaluate every validation rule offline against a copy of
# variables.tf and this file.

locals {
  # GPUs built into each G2 machine type. G2 machines carry NVIDIA L4 GPUs
  # only, and the count is fixed by the machine type (Compute Engine,
  # "Accelerator-optimized machine family", G2 series table). Note the odd one
  # out: g2-standard-32 has one GPU, fewer than g2-standard-24.
  g2_gpus_per_machine_type = {
    "g2-standard-4"  = 1
    "g2-standard-8"  = 1
    "g2-standard-12" = 1
    "g2-standard-16" = 1
    "g2-standard-24" = 2
    "g2-standard-32" = 1
    "g2-standard-48" = 4
    "g2-standard-96" = 8
  }

  # Hosts of a multi-host TPU v5e slice of ct5lp-hightpu-4t machines (4 chips
  # each), by topology: chips / 4. Smaller v5e topologies fit on one host and
  # are no slice (GKE, "Plan TPUs in GKE", the v5e table:
  # https://cloud.google.com/kubernetes-engine/docs/concepts/plan-tpus).
  tpu_v5e_hosts_per_topology = {
    "4x4"   = 4
    "4x8"   = 8
    "8x8"   = 16
    "8x16"  = 32
    "16x16" = 64
  }

  # APIs this module needs. compute and container create the network and the
  # cluster; iam makes the node service account; cloudresourcemanager reads
  # and writes the project IAM policy; logging and monitoring receive what
  # the node service account writes; file (Filestore) is what the cluster's
  # Filestore CSI driver calls to create the checkpoint share of
  # deploy/multihost-checkpoint.yaml.
  required_apis = [
    "cloudresourcemanager.googleapis.com",
    "compute.googleapis.com",
    "container.googleapis.com",
    "file.googleapis.com",
    "iam.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
  ]

  labels = merge(var.labels, {
    course     = "jax-data-parallel"
    managed-by = "terraform"
  })
}
