provider "google" {
  project = var.project_id
  region  = var.region
}

# ---------------------------------------------------------------------------
# APIs. disable_on_destroy = false: `terraform destroy` must not switch off
# APIs that other things in the project may use (and disabling compute would
# fail while any disk or address is left).
# ---------------------------------------------------------------------------

resource "google_project_service" "apis" {
  for_each = toset(local.required_apis)

  project            = var.project_id
  service            = each.value
  disable_on_destroy = false
}

# ---------------------------------------------------------------------------
# Network: a dedicated VPC with one subnet and secondary ranges for pods and
# services (VPC-native cluster). Private Google access lets nodes reach Google
# APIs over internal routes.
# ---------------------------------------------------------------------------

resource "google_compute_network" "vpc" {
  #checkov:skip=CKV2_GCP_18:No rule of our own on purpose: the VPC's implied deny-all-ingress rule applies, and GKE creates (and deletes) the allow rules it needs: control plane to nodes, load balancer health checks and the Service's loadBalancerSourceRanges. A rule here would repeat the implied one or open more.
  name                    = "${var.cluster_name}-net"
  auto_create_subnetworks = false

  depends_on = [google_project_service.apis]
}

resource "google_compute_subnetwork" "nodes" {
  #checkov:skip=CKV_GCP_26:VPC flow logs would bill Cloud Logging ingestion for a network that carries one JupyterLab session and some package downloads for a few hours, and nobody reads them in a workshop.
  name                     = "${var.cluster_name}-nodes"
  region                   = var.region
  network                  = google_compute_network.vpc.id
  ip_cidr_range            = "10.10.0.0/20"
  private_ip_google_access = true

  secondary_ip_range {
    range_name    = "pods"
    ip_cidr_range = "10.20.0.0/16"
  }

  secondary_ip_range {
    range_name    = "services"
    ip_cidr_range = "10.30.0.0/20"
  }
}

# ---------------------------------------------------------------------------
# Node service account: its own, with only the role GKE documents for nodes
# (write logs and metrics, read monitoring). Images come from public
# registries, so no Artifact Registry role is needed.
# ---------------------------------------------------------------------------

resource "google_service_account" "nodes" {
  account_id   = "${var.cluster_name}-nodes"
  display_name = "GKE nodes of ${var.cluster_name}"

  depends_on = [google_project_service.apis]
}

resource "google_project_iam_member" "nodes_default_role" {
  project = var.project_id
  role    = "roles/container.defaultNodeServiceAccount"
  member  = "serviceAccount:${google_service_account.nodes.email}"
}

# ---------------------------------------------------------------------------
# Cluster: zonal (one zone has the GPUs; a zonal control plane is covered by
# the GKE free tier), default node pool removed in favour of the GPU pool.
# ---------------------------------------------------------------------------

resource "google_container_cluster" "course" {
  #checkov:skip=CKV_GCP_20:The control plane keeps its public endpoint open to any address by default so the instructor can run kubectl from a laptop or Cloud Shell (whose address changes); every request still needs Google credentials, and var.control_plane_authorized_cidrs turns on authorized networks when the addresses are known.
  #checkov:skip=CKV_GCP_25:Nodes keep external addresses so that pods can download the CUDA wheels and clone the course; private nodes would need Cloud NAT, one more billed part that can fail. Inbound traffic to the nodes is still closed except for what GKE's firewall rules and the Service allow-list open.
  #checkov:skip=CKV_GCP_64:Same decision as CKV_GCP_25 (private nodes would need Cloud NAT for the package downloads).
  #checkov:skip=CKV_GCP_24:PodSecurityPolicy was removed in Kubernetes 1.25 and GKE rejects it on every version a release channel offers; the pods' security contexts are set in deploy/*.yaml instead.
  #checkov:skip=CKV_GCP_61:Intranode visibility only feeds VPC flow logs, which are off for the reason given at CKV_GCP_26.
  #checkov:skip=CKV_GCP_65:Google Groups for RBAC needs a Google Workspace domain with a gke-security-groups group, which a workshop project usually does not have; one instructor administers the cluster.
  #checkov:skip=CKV_GCP_66:Binary Authorization needs attestors and a signing process; the course runs one public image pinned by tag (python:3.12.11-bookworm), and an allow-all policy would only pretend to check it.
  #checkov:skip=CKV_GCP_69:This cluster block's node_config would describe only the default pool, which remove_default_node_pool deletes; GKE_METADATA is set on the GPU node pool, where CKV_GCP_69 passes.
  name     = var.cluster_name
  location = var.zone

  remove_default_node_pool = true
  initial_node_count       = 1

  network         = google_compute_network.vpc.id
  subnetwork      = google_compute_subnetwork.nodes.id
  networking_mode = "VPC_NATIVE"

  ip_allocation_policy {
    cluster_secondary_range_name  = "pods"
    services_secondary_range_name = "services"
  }

  # Dataplane V2 enforces NetworkPolicy objects (deploy/jupyter.yaml has one);
  # the Calico add-on must then stay off.
  datapath_provider = "ADVANCED_DATAPATH"
  network_policy {
    enabled = false
  }

  workload_identity_config {
    workload_pool = "${var.project_id}.svc.id.goog"
  }

  # GKE's Filestore CSI driver: ReadWriteMany volumes backed by Filestore
  # instances, the shared checkpoint folder of deploy/multihost-checkpoint.yaml
  # (every pod of a multi-host run writes its shards there). Enabling it on
  # an existing cluster updates the cluster in place; an instance exists,
  # and bills, only while a claim for one does.
  addons_config {
    gcp_filestore_csi_driver_config {
      enabled = true
    }
  }

  release_channel {
    channel = var.release_channel
  }

  enable_shielded_nodes = true

  master_auth {
    client_certificate_config {
      issue_client_certificate = false
    }
  }

  dynamic "master_authorized_networks_config" {
    for_each = length(var.control_plane_authorized_cidrs) > 0 ? [1] : []
    content {
      dynamic "cidr_blocks" {
        for_each = var.control_plane_authorized_cidrs
        content {
          cidr_block   = cidr_blocks.value.cidr_block
          display_name = cidr_blocks.value.display_name
        }
      }
    }
  }

  resource_labels = local.labels

  deletion_protection = var.deletion_protection

  depends_on = [google_project_service.apis]
}

# ---------------------------------------------------------------------------
# GPU node pool (the lab pod of deploy/jupyter.yaml, the notebook Job, the
# hub's "two L4" profile). No taint of our own: with the CPU pool below in the
# cluster, GKE taints GPU nodes nvidia.com/gpu=present:NoSchedule by itself,
# so only pods that tolerate it (the course's GPU pods) land here and the
# system pods stay on the CPU pool.
# ---------------------------------------------------------------------------

resource "google_container_node_pool" "gpu" {
  name       = "gpu-pool"
  location   = var.zone
  cluster    = google_container_cluster.course.id
  node_count = var.gpu_node_count

  management {
    auto_repair  = true
    auto_upgrade = true
  }

  # Replace nodes in place on upgrades: a surge node would need a further
  # gpu_count GPUs of quota, which a workshop project rarely has.
  upgrade_settings {
    max_surge       = 0
    max_unavailable = 1
  }

  node_config {
    machine_type    = var.machine_type
    image_type      = "COS_CONTAINERD"
    disk_type       = "pd-balanced"
    disk_size_gb    = var.disk_size_gb
    spot            = var.spot
    service_account = google_service_account.nodes.email
    # Access is limited by the service account's IAM roles, as GKE recommends;
    # the scope itself no longer restricts anything.
    oauth_scopes = ["https://www.googleapis.com/auth/cloud-platform"]

    guest_accelerator {
      type  = var.gpu_type
      count = var.gpu_count

      # GKE installs the NVIDIA driver; without this block the device plugin
      # never advertises nvidia.com/gpu and GPU pods stay Pending forever.
      gpu_driver_installation_config {
        gpu_driver_version = var.gpu_driver_version
      }
    }

    workload_metadata_config {
      mode = "GKE_METADATA"
    }

    shielded_instance_config {
      enable_secure_boot          = true
      enable_integrity_monitoring = true
    }

    labels          = local.labels
    resource_labels = local.labels
  }

  depends_on = [google_project_iam_member.nodes_default_role]
}

# ---------------------------------------------------------------------------
# CPU pool: the hub, its proxy and culler, GKE's system pods, and the learners
# of the default profile ("CPU, 8 simulated devices"). Autoscaled between its
# limits as learners start and stop servers.
# ---------------------------------------------------------------------------

resource "google_container_node_pool" "cpu" {
  name               = "cpu-pool"
  location           = var.zone
  cluster            = google_container_cluster.course.id
  initial_node_count = var.cpu_min_node_count

  autoscaling {
    min_node_count = var.cpu_min_node_count
    max_node_count = var.cpu_max_node_count
  }

  management {
    auto_repair  = true
    auto_upgrade = true
  }

  node_config {
    machine_type    = var.cpu_machine_type
    image_type      = "COS_CONTAINERD"
    disk_type       = "pd-balanced"
    disk_size_gb    = var.disk_size_gb
    service_account = google_service_account.nodes.email
    oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]

    workload_metadata_config {
      mode = "GKE_METADATA"
    }

    shielded_instance_config {
      enable_secure_boot          = true
      enable_integrity_monitoring = true
    }

    labels          = local.labels
    resource_labels = local.labels
  }

  depends_on = [google_project_iam_member.nodes_default_role]
}

# ---------------------------------------------------------------------------
# TPU v5e slice pool (deploy/tpu-slice), only when tpu_topology is set: one
# multi-host slice, its hosts created and removed together. GKE asks a
# multi-host slice's pool for a COMPACT placement policy naming the topology,
# and taints its nodes google.com/tpu=present:NoSchedule itself
# (https://cloud.google.com/kubernetes-engine/docs/how-to/tpus).
# ---------------------------------------------------------------------------

resource "google_container_node_pool" "tpu" {
  count = var.tpu_topology == "" ? 0 : 1

  name       = "tpu-v5e-pool"
  location   = var.zone
  cluster    = google_container_cluster.course.id
  node_count = lookup(local.tpu_v5e_hosts_per_topology, var.tpu_topology, 0)

  management {
    auto_repair  = true
    auto_upgrade = true
  }

  placement_policy {
    type         = "COMPACT"
    tpu_topology = var.tpu_topology
  }

  node_config {
    machine_type    = "ct5lp-hightpu-4t"
    image_type      = "COS_CONTAINERD"
    disk_type       = "pd-balanced"
    disk_size_gb    = var.disk_size_gb
    spot            = var.tpu_spot
    service_account = google_service_account.nodes.email
    oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]

    workload_metadata_config {
      mode = "GKE_METADATA"
    }

    shielded_instance_config {
      enable_secure_boot          = true
      enable_integrity_monitoring = true
    }

    labels          = local.labels
    resource_labels = local.labels
  }

  depends_on = [google_project_iam_member.nodes_default_role]
}

# ---------------------------------------------------------------------------
# Time-shared GPU pool: the hub's "one shared L4" profile. GKE shares each L4
# between max_shared_clients_per_gpu containers (TIME_SHARING or MPS); a
# container there may ask for at most one nvidia.com/gpu, and time-sharing
# isolates no memory, so the profile keeps JAX's preallocation off. The pool
# starts empty and grows to shared_gpu_max_node_count; 0 leaves it out.
# ---------------------------------------------------------------------------

resource "google_container_node_pool" "gpu_shared" {
  count = var.shared_gpu_max_node_count > 0 ? 1 : 0

  name               = "gpu-shared-pool"
  location           = var.zone
  cluster            = google_container_cluster.course.id
  initial_node_count = 0

  autoscaling {
    min_node_count = 0
    max_node_count = var.shared_gpu_max_node_count
  }

  management {
    auto_repair  = true
    auto_upgrade = true
  }

  upgrade_settings {
    max_surge       = 0
    max_unavailable = 1
  }

  node_config {
    machine_type    = var.shared_gpu_machine_type
    image_type      = "COS_CONTAINERD"
    disk_type       = "pd-balanced"
    disk_size_gb    = var.disk_size_gb
    spot            = var.spot
    service_account = google_service_account.nodes.email
    oauth_scopes    = ["https://www.googleapis.com/auth/cloud-platform"]

    guest_accelerator {
      type  = var.gpu_type
      count = local.g2_gpus_per_machine_type[var.shared_gpu_machine_type]

      gpu_driver_installation_config {
        gpu_driver_version = var.gpu_driver_version
      }

      gpu_sharing_config {
        gpu_sharing_strategy       = var.gpu_sharing_strategy
        max_shared_clients_per_gpu = var.max_shared_clients_per_gpu
      }
    }

    workload_metadata_config {
      mode = "GKE_METADATA"
    }

    shielded_instance_config {
      enable_secure_boot          = true
      enable_integrity_monitoring = true
    }

    labels          = local.labels
    resource_labels = local.labels
  }

  depends_on = [google_project_iam_member.nodes_default_role]
}
