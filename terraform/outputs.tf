output "project_id" {
  description = "Project that holds the cluster."
  value       = var.project_id
}

output "cluster_name" {
  description = "Name of the GKE cluster."
  value       = google_container_cluster.course.name
}

output "zone" {
  description = "Zone of the cluster and its GPU nodes."
  value       = google_container_cluster.course.location
}

output "machine_type" {
  description = "Machine type of the GPU nodes."
  value       = var.machine_type
}

output "gpu_count" {
  description = "GPUs per node: the nvidia.com/gpu limit in deploy/*.yaml must equal it."
  value       = var.gpu_count
}

output "node_service_account" {
  description = "Service account the GPU nodes run as."
  value       = google_service_account.nodes.email
}

output "get_credentials_command" {
  description = "Run this to point kubectl at the new cluster."
  value       = "gcloud container clusters get-credentials ${google_container_cluster.course.name} --zone ${google_container_cluster.course.location} --project ${var.project_id}"
}
