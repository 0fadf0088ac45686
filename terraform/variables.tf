variable "project_id" {
  description = "Google Cloud project that holds the cluster (its ID, not its name or number)."
  type        = string

  validation {
    condition     = can(regex("^[a-z][a-z0-9-]{4,28}[a-z0-9]$", var.project_id))
    error_message = "project_id must be a project ID: 6 to 30 lowercase letters, digits or hyphens, starting with a letter (see `gcloud projects list`)."
  }
}

variable "region" {
  description = "Region of the network and subnet. It must contain var.zone."
  type        = string
  default     = "us-central1"
}

variable "zone" {
  description = "Zone of the cluster and its GPU nodes. NVIDIA L4 GPUs exist only in some zones (us-central1-a, -b and -c do); list them with `gcloud compute accelerator-types list --filter=\"name=nvidia-l4\"`."
  type        = string
  default     = "us-central1-a"

  validation {
    condition     = startswith(var.zone, "${var.region}-")
    error_message = "zone must lie in region (for region us-central1, a zone such as us-central1-a): set zone and region together."
  }
}

variable "cluster_name" {
  description = "Name of the GKE cluster; also the prefix of the network, subnet and node service account."
  type        = string
  default     = "jax-course"

  validation {
    # The node service account ID is "<cluster_name>-nodes" and may hold at
    # most 30 characters, which caps cluster_name at 24.
    condition     = can(regex("^[a-z][a-z0-9-]{0,22}[a-z0-9]$", var.cluster_name))
    error_message = "cluster_name must be 1 to 24 lowercase letters, digits or hyphens, starting with a letter and not ending with a hyphen."
  }
}

variable "machine_type" {
  description = "G2 machine type of the GPU nodes. g2-standard-24 has 2 L4 GPUs, g2-standard-48 has 4 (the scaling exercise), g2-standard-96 has 8."
  type        = string
  default     = "g2-standard-24"

  validation {
    condition     = contains(keys(local.g2_gpus_per_machine_type), var.machine_type)
    error_message = "machine_type must be a G2 machine type (the only machines with NVIDIA L4 GPUs): one of g2-standard-4, -8, -12, -16, -24, -32, -48, -96."
  }
}

variable "gpu_type" {
  description = "Accelerator type attached to the GPU nodes. G2 machines carry NVIDIA L4 only."
  type        = string
  default     = "nvidia-l4"

  validation {
    condition     = var.gpu_type == "nvidia-l4"
    error_message = "gpu_type must be \"nvidia-l4\": G2 machine types come with L4 GPUs and no other type."
  }
}

variable "gpu_count" {
  description = "GPUs per node. Fixed by the machine type: 2 for g2-standard-24, 4 for g2-standard-48. deploy/*.yaml request the same number (nvidia.com/gpu)."
  type        = number
  default     = 2

  validation {
    condition     = var.gpu_count == lookup(local.g2_gpus_per_machine_type, var.machine_type, -1)
    error_message = "gpu_count must equal the GPUs built into machine_type: set gpu_count = ${lookup(local.g2_gpus_per_machine_type, var.machine_type, -1)} for ${var.machine_type} (2 for g2-standard-24, 4 for g2-standard-48), and the same count as nvidia.com/gpu in deploy/jupyter.yaml and deploy/notebook-tests.yaml."
  }
}

variable "gpu_node_count" {
  description = "Number of GPU nodes. The course runs on one node; more nodes are for multi-host work."
  type        = number
  default     = 1

  validation {
    condition     = var.gpu_node_count >= 1 && floor(var.gpu_node_count) == var.gpu_node_count
    error_message = "gpu_node_count must be a whole number of at least 1."
  }
}

variable "gpu_driver_version" {
  description = "NVIDIA driver that GKE installs on the GPU nodes: DEFAULT (GKE's default for the node version) or LATEST. The course's jax[cuda12] wheels need driver 525 or newer, which both provide. Changing it on a running cluster replaces the node pool (ForceNew): the lab pod goes and must be re-applied (kubectl apply -f deploy/jupyter.yaml)."
  type        = string
  default     = "DEFAULT"

  validation {
    condition     = contains(["DEFAULT", "LATEST"], var.gpu_driver_version)
    error_message = "gpu_driver_version must be DEFAULT or LATEST. (INSTALLATION_DISABLED would leave pods waiting for a driver that never comes.)"
  }
}

variable "disk_size_gb" {
  description = "Boot disk of each GPU node in GB: container images plus the Job's scratch space (a fresh CUDA environment is about 8 GB)."
  type        = number
  default     = 100

  validation {
    condition     = var.disk_size_gb >= 50
    error_message = "disk_size_gb must be at least 50: the images and a CUDA-enabled Python environment do not fit in less."
  }
}

variable "spot" {
  description = "Run the GPU nodes as Spot VMs: much cheaper, but Compute Engine may reclaim them at any time, ending every running kernel. Leave false for a workshop."
  type        = bool
  default     = false
}

variable "tpu_topology" {
  description = "A TPU v5e slice node pool of this topology for deploy/tpu-slice: ct5lp-hightpu-4t hosts of 4 chips, so 4x4 (v5e-16) is four hosts. Empty (the default) leaves the pool out. Its nodes bill from terraform apply until the pool is removed, whether a Job runs or not."
  type        = string
  default     = ""

  validation {
    condition     = var.tpu_topology == "" || contains(keys(local.tpu_v5e_hosts_per_topology), var.tpu_topology)
    error_message = "tpu_topology must be empty (no TPU pool) or a multi-host v5e topology: 4x4, 4x8, 8x8, 8x16 or 16x16."
  }
}

variable "tpu_spot" {
  description = "Run the TPU slice's hosts as Spot VMs: cheaper, and any of them may be reclaimed at any time, which ends the slice's run (deploy/tpu-slice/multihost-checkpoint resumes it)."
  type        = bool
  default     = false
}

variable "release_channel" {
  description = "GKE release channel, which picks the Kubernetes version and keeps it patched."
  type        = string
  default     = "REGULAR"

  validation {
    condition     = contains(["RAPID", "REGULAR", "STABLE"], var.release_channel)
    error_message = "release_channel must be RAPID, REGULAR or STABLE."
  }
}

variable "control_plane_authorized_cidrs" {
  description = "CIDR blocks allowed to reach the Kubernetes API (kubectl), for example [{ cidr_block = \"203.0.113.7/32\", display_name = \"instructor\" }]. Empty: any address, still behind Google sign-in (works from Cloud Shell, whose address changes)."
  type = list(object({
    cidr_block   = string
    display_name = string
  }))
  default = []

  validation {
    condition     = alltrue([for block in var.control_plane_authorized_cidrs : can(cidrhost(block.cidr_block, 0)) && block.cidr_block != "0.0.0.0/0"])
    error_message = "Each control_plane_authorized_cidrs entry needs a valid CIDR block other than 0.0.0.0/0 (leave the list empty for no restriction)."
  }
}

variable "deletion_protection" {
  description = "Refuse to delete the cluster. Off for a workshop cluster so that `terraform destroy` removes it."
  type        = bool
  # false on purpose: google provider 5.0 and later default deletion_protection
  # to true, and `terraform destroy` then fails on the cluster, leaving the GPU
  # node billing until someone notices.
  default = false
}

variable "labels" {
  description = "Extra labels on the cluster and its nodes (billing reports group by them)."
  type        = map(string)
  default     = {}
}

# ---------------------------------------------------------------------------
# A room of learners (deploy/hub/config.yaml): a CPU pool for the hub and the
# "CPU, 8 simulated devices" learners, and a pool of time-shared L4 GPUs for
# the "one shared L4" learners. The GPU pool above serves the "two L4"
# profile. Each pool autoscales between its limits; tools/preflight.py counts
# every pool at its maximum.
# ---------------------------------------------------------------------------

variable "cpu_machine_type" {
  description = "Machine type of the CPU pool (the hub, the proxy, the culler and the learners on simulated CPU devices). e2-standard-8 has 8 vCPUs and 32 GB: three learners of the CPU profile (2 vCPUs, 7 GiB each) per node."
  type        = string
  default     = "e2-standard-8"

  validation {
    condition     = can(regex("^(e2|n2|n2d|n4|c3|c3d|c4)-(standard|highmem|highcpu)-[0-9]+$", var.cpu_machine_type))
    error_message = "cpu_machine_type must be a general-purpose type such as e2-standard-8 or n2-standard-16 (a G2 type belongs in machine_type or shared_gpu_machine_type)."
  }
}

variable "cpu_min_node_count" {
  description = "Fewest CPU nodes: at least 1, because the hub and GKE's system pods run there."
  type        = number
  default     = 1

  validation {
    condition     = var.cpu_min_node_count >= 1 && floor(var.cpu_min_node_count) == var.cpu_min_node_count
    error_message = "cpu_min_node_count must be a whole number of at least 1 (the hub runs on the CPU pool)."
  }
}

variable "cpu_max_node_count" {
  description = "Most CPU nodes the autoscaler may add. make plan-workshop says how many a room needs."
  type        = number
  default     = 9

  validation {
    condition     = var.cpu_max_node_count >= var.cpu_min_node_count && floor(var.cpu_max_node_count) == var.cpu_max_node_count
    error_message = "cpu_max_node_count must be a whole number no smaller than cpu_min_node_count."
  }
}

variable "shared_gpu_machine_type" {
  description = "G2 machine type of the time-shared GPU pool (the \"one shared L4\" profile). Its GPU count follows from the type (g2-standard-24: 2)."
  type        = string
  default     = "g2-standard-24"

  validation {
    condition     = contains(keys(local.g2_gpus_per_machine_type), var.shared_gpu_machine_type)
    error_message = "shared_gpu_machine_type must be a G2 machine type: one of g2-standard-4, -8, -12, -16, -24, -32, -48, -96."
  }
}

variable "shared_gpu_max_node_count" {
  description = "Most nodes of the time-shared GPU pool (it starts at 0 and grows when a learner picks the shared-L4 profile). 0 leaves the pool out."
  type        = number
  default     = 0

  validation {
    condition     = var.shared_gpu_max_node_count >= 0 && floor(var.shared_gpu_max_node_count) == var.shared_gpu_max_node_count
    error_message = "shared_gpu_max_node_count must be a whole number, 0 or more (0: no shared GPU pool)."
  }
}

variable "gpu_sharing_strategy" {
  description = "How GKE shares each L4 of the shared pool: TIME_SHARING (containers take turns; no memory isolation) or MPS (NVIDIA Multi-Process Service: concurrent kernels, a per-client memory limit). L4 has no MIG."
  type        = string
  default     = "TIME_SHARING"

  validation {
    condition     = contains(["TIME_SHARING", "MPS"], var.gpu_sharing_strategy)
    error_message = "gpu_sharing_strategy must be TIME_SHARING or MPS (L4 GPUs have no MIG partitions)."
  }
}

variable "max_shared_clients_per_gpu" {
  description = "Learners' containers per physical L4 in the shared pool. Each gets 1/N of the GPU's time and shares its 24 GB of memory; the course keeps memory preallocation off in that profile. deploy/hub/config.yaml selects nodes with the same number."
  type        = number
  default     = 4

  validation {
    # GKE accepts 2 to 48 clients per GPU for time-sharing and MPS.
    condition     = var.max_shared_clients_per_gpu >= 2 && var.max_shared_clients_per_gpu <= 48 && floor(var.max_shared_clients_per_gpu) == var.max_shared_clients_per_gpu
    error_message = "max_shared_clients_per_gpu must be a whole number from 2 to 48 (GKE's range); 4 gives each learner about 6 GB of an L4's 24 GB."
  }
}
